"""The Temporal role: our Go host embedding Temporal's server, supervised by the server.

Its modules:

- `host.py`: the Temporal host binary and the configuration it reads on stdin.
- `host_keeper.py`: run the host as a child, restart it when it dies, talk to it (named
  apart from the node's attempt supervisor, an unrelated thing).
- `host_logs.py`: how the Temporal host's log lines become ours.
- `namespaces.py`: temporal namespaces, one per tenant, registered through the frontend as
  this server.
- `node_access.py`: keep the host's node table equal to the `nodes` table.
- `operator_access.py`: keep the host's table of operators' grants equal to `operators`:
  each one's current certificate serial, role and tenants.
- `role.py`: the temporal role as the server runs it: the host kept running, node table
  sync, namespaces.
"""
