"""orchestrator-zero server.

Its modules:

- `access.py`: who may do what: roles, the rights they give, a person's tenant scope, and
  the one table that names the right every API route and web action needs (deny by default).
- `agent_file/`: the agent as one file (`oz0-node`): built by build.py, started by
  bootstrap.py, served by every server (oz0.server.api.agent_file).
- `audit.py`: the audit log: one row per mutating command, written in the command's
  transaction.
- `audit_stream.py`: the audit log followed (GET /api/v1/events): its rows in the order
  their transactions became complete, from a cursor, none skipped and none twice, however
  the writers' transactions interleave.
- `cap_rules.py`: caps on what one person or one tenant may hold or ask for, so that no one
  of them takes a server's database pool, its live-update slots or Temporal's schedules from
  the others: their defaults.
- `cluster.py`: the cluster row: its name, shard count and CAs, unsealed with the master
  key.
- `cluster_init.py`: `server init`: create a cluster, or leave nothing behind when that
  fails.
- `context.py`: a CLI context: where a cluster's servers are and the operator credentials to
  reach them.
- `devmode.py`: `--dev`: a whole cluster in one directory, on an embedded PostgreSQL 16.
- `enrollment.py`: adding a person: `operator add` makes a one-time enrollment code,
  `operator enroll` on the person's own machine trades it.
- `errors.py`: errors that reach a user as one clear line: the server's own, besides the
  shared ones.
- `file_blob_cache.py`: a server's cache of pushed files' rows (oz0/file_blobs.py), read
  once for many nodes.
- `file_blobs.py`: files pushed to nodes, stored in PostgreSQL (issue 43, docs/files.md).
- `jobs/`: jobs: commands run on the fleet's nodes through Temporal.
- `joins.py`: joins with a token, many in one transaction: what the edge's join batcher
  writes.
- `json_values.py`: values as the API's JSON writes them, the same in every answer.
- `label_rules.py`: a label's rules, for nodes, tokens and selectors alike: what a key and a
  value may be, and the one line that says what is wrong.
- `leaving.py`: a person's power ends when they leave, and shrinks when they are demoted or
  re-scoped.
- `listing.py`: listings: the WHERE clause of their filters, and keyset paging of the API's
  lists (the `limit` asked for and the opaque `cursor`).
- `membership.py`: membership: each server keeps a row fresh; a server is up while its
  heartbeat is recent.
- `node_labels.py`: whether a joining node's own labels count: the cluster's setting that
  locks every node's labels to its token's (`cluster set --lock-node-labels`).
- `node_rules.py`: what a node ID and node labels look like, and how many nodes one request
  may name.
- `node_sessions.py`: sessions' records (docs/sessions.md): who opened which on what node,
  when, how it ended, and its recording, an asciicast v2 file
  (https://docs.asciinema.org/manual/asciicast/v2/) kept as the header.
- `node_strings.py`: what a node may say about itself at its join: the strings operators
  will later read.
- `nodes/`: nodes: the machines of the fleet, each a row of `nodes`; every caller uses them
  as `from oz0 import nodes` and the names below.
- `operator_issue.py`: `server operator issue`: new operator credentials from the database
  and master key alone.
- `operators.py`: operators: who may use the management API, each with exactly one valid
  certificate.
- `passwords.py`: web UI passwords: generated once, stored only as a salted scrypt hash.
- `pki.py`: master key, sealed CAs and the certificates they sign.
- `purge_command.py`: purge commands: what the edge sends a purging node, signed with the
  cluster CA's key.
- `retention_rules.py`: how long history is kept, and how many jobs a tenant may have
  queued: the bounds, and durations as operators type them (`12h`, `30d`).
- `server/`: `server start`: one process, one trio.run, every role as a task of one root
  nursery.
- `server_defaults.py`: defaults of `server start`'s options that `orchestrator-zero server
  start --help` shows.
- `store/`: the PostgreSQL store: connection URLs, the query pool, LISTEN, migrations.
- `temporal/`: the Temporal role: our Go host embedding Temporal's server, supervised by the
  server.
- `tenant_caps.py`: a tenant's caps on its schedules and join tokens (`tenant create/set
  --max-schedules, --min-schedule-interval, --max-join-tokens`; bounds and refusals in
  oz0/cap_rules.py).
- `tenants.py`: tenants: each has a Temporal namespace of the same name, a job retention
  (the namespace's retention matches it), a cap on its jobs queued at once.
- `token_rules.py`: what a join token's ID and labels look like, and what a token gets by
  default.
- `tokens.py`: join tokens: a node presenting one joins accepted, in the token's tenant with
  its labels.
- `ui_accounts.py`: web UI accounts' passwords: the rules for a new one, changing it, and
  the reset a server's operator makes with the master key (`server ui-password`).
- `ui_sessions.py`: web UI sessions: a random token in a `__Host-` cookie, its SHA-256 in
  `ui_sessions`.
- `web/`: the web UI on 8443, served by every server beside the JSON API.
"""

from oz0_common import __version__ as __version__
