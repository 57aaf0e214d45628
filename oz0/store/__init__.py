"""The PostgreSQL store: connection URLs, the query pool, LISTEN, migrations."""
