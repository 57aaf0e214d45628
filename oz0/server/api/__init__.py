"""The management API: one module per resource, each with `register(app, state)`."""
