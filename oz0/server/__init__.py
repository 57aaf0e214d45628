"""`server start`: one process, one trio.run, every role as a task of one root nursery.

Its modules:

- `accept_bursts.py`: accepting connections in bursts: every connection waiting, not one per
  pass of Trio.
- `admission.py`: admission of connections that have not proven who they are yet (7443 and
  8443).
- `api/`: the management API: one module per resource, each with `register(app, state)`.
- `audit_follow.py`: the audit log's followers on this server (GET /api/v1/events,
  docs/audit-events.md): each stream's lines, and the slots they hold.
- `certificates.py`: this server's own certificates: issued at start, renewed daily, never
  written to disk.
- `cluster_counts.py`: what `/metrics` reads of the whole cluster from PostgreSQL: nodes by
  tenant and state, the servers up, the jobs not ended and how long the oldest have waited.
- `edge/`: the edge role on 7443: joins and control streams of nodes
  (docs/node-protocol.md).
- `gc_tuning.py`: the cyclic garbage collector of a long-running server with thousands of
  streams.
- `https.py`: serve an ASGI app over our own TLS listener, handing the app the peer's
  certificate.
- `join_command.py`: the one shell command line a node joins with, as `token create`, its
  `--json` and the web UI's token page give it (docs/manage-nodes.md, "Join a node").
- `lingering.py`: an answer given before its request's body came in ends only once the rest
  of the body is read (a lingering close), so the client reads the answer, not a reset.
- `logs.py`: where a server's log lines go: the console, and with a log directory its files.
- `loop_lag.py`: how late the server's one Trio thread wakes a task: what every stream and
  request waits.
- `management.py`: the management role: the JSON API the CLI calls on 8443 with operator
  certificates.
- `metrics.py`: the server's Prometheus metrics (`GET /metrics` on 8443;
  docs/run-a-cluster.md lists them).
- `person_limits.py`: what one person may hold or ask of this server: web sessions (counted
  cluster-wide), live pages, event streams and requests a second (this server's own), from
  `server start`'s flags.
- `ports_free.py`: whether the management and edge ports can be had, asked before the
  server starts anything.
- `readiness.py`: whether this server should be sent work (`GET /readyz`): its database
  answers, its membership row is fresh and its Temporal host serves.
- `service_unit.py`: `orchestrator-zero server install-service`: the systemd unit that runs
  a server (docs/run-a-cluster.md, "Run a server under systemd"), beside the agent's
  (oz0_node/service.py).
- `session_recording.py`: a live session's recording (oz0/node_sessions.py keeps it):
  asciicast v2 events, written to PostgreSQL in sealed chunks as they happen.
- `session_relay.py`: between a person's session (its websocket on the management API,
  api/sessions.py) and the node's control stream this server's edge holds (edge/control.py),
  in this process.
- `session_sweeper.py`: sessions a stopped server left open, ended in the records
  (docs/sessions.md, "When a session ends").
- `start.py`: start a server: check everything that can be checked before any task runs,
  then run.
- `systemd_notify.py`: tell systemd how a `Type=notify` service is doing: sd_notify(3)'s
  protocol, which is one datagram of `NAME=VALUE` lines to the unix socket named by
  $NOTIFY_SOCKET.
- `tls.py`: TLS contexts built from keys held in memory.
"""
