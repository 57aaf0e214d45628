"""The PostgreSQL store: connection URLs, the query pool, LISTEN, migrations.

Its modules:

- `batches.py`: small changes that arrive together, written in one transaction.
- `databases.py`: creating, checking and dropping the cluster's three databases.
- `dburl.py`: the `OZ0_DB` URL and the three databases named after it.
- `events.py`: the events role: one LISTEN connection per server, fanned out to whoever
  waits.
- `listen.py`: a dedicated LISTEN connection woken by the event loop, not by polling.
- `migrations.py`: numbered SQL migrations of the `oz0` database, and which servers may run
  beside them.
- `outage.py`: loops that touch the database outlive it: one log line per outage, retries
  with backoff.
- `pool.py`: queries under Trio: a sync psycopg pool driven through worker threads.
"""
