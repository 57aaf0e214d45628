"""The management API: one module per resource, each with `register(app, state)`.

Its modules:

- `agent_file.py`: GET /agent/oz0-node and /agent/oz0-node.sha256: the agent file, with no
  sign-in (it holds no secret; the join command checks it against the SHA-256 it was given).
- `audit.py`: GET /api/v1/audit: newest first, paged like GET /api/v1/nodes (`limit`, an
  opaque `cursor`, `next_cursor` in the answer); `before=ID` (older than that entry) still
  works.
- `cluster.py`: GET and PATCH /api/v1/cluster.
- `common.py`: what every API module shares: the state, errors, the calling operator,
  request bodies.
- `described.py`: what a route takes and answers, as types beside its handler: the OpenAPI
  document (openapi.py) is made from these, and the tests hold the real answers to them.
- `events.py`: GET /api/v1/events: the audit log as it happens, one JSON object a line
  (NDJSON), resumable from a cursor with nothing skipped and nothing twice, scoped as the
  audit list is (docs/audit-events.md).
- `files.py`: POST/GET /api/v1/files, GET/DELETE /api/v1/files/<sha256>?tenant=T, POST
  /api/v1/files/<sha256>/chunks: the files a tenant pushes to its nodes (oz0/file_blobs.py,
  docs/files.md).
- `health.py`: GET /metrics, /healthz and /readyz: for monitoring, with no sign-in (none
  holds a secret; oz0.server.metrics keeps IDs and tenant names out of the metrics).
- `jobs.py`: POST/GET /api/v1/jobs, GET /api/v1/jobs/<id>, GET /api/v1/jobs/<id>/output,
  POST /api/v1/jobs/<id>/cancel.
- `nodes.py`: GET /api/v1/nodes (paged: limit, cursor; filters state, tenant, label,
  search), GET /api/v1/nodes/<id>, POST /api/v1/nodes/<id>/accept, /reject, /block,
  /unblock, /purge, DELETE /api/v1/nodes/<id>.
- `openapi.py`: GET /api/v1/openapi.json: the API described (OpenAPI 3.1), made from the
  routes' own marks (described.py) and the app's URL map, so a route and its description are
  one thing.
- `operator_cache.py`: operator certificates the management API found current a moment ago,
  with who they are (the person: role and tenants).
- `operators.py`: POST /api/v1/operator/renew (a person's own certificate); GET and POST
  /api/v1/operator/enroll (no identity: what a new person pins, then its code traded for its
  certificate).
- `schedules.py`: POST/GET /api/v1/schedules, GET /api/v1/schedules/<id>, POST .../pause,
  .../unpause, .../trigger, PATCH (an admin gives it to a new owner) and DELETE
  /api/v1/schedules/<id>.
- `session_records.py`: GET /api/v1/sessions (newest first; `node`, `person`, `live`,
  `limit`), GET /api/v1/sessions/<id>, GET /api/v1/sessions/<id>/recording (its asciicast v2
  file, as `asciicast` in a JSON object).
- `sessions.py`: WEBSOCKET /api/v1/nodes/<id>/session: a person's interactive session on a
  node (docs/sessions.md; the messages: oz0_common/session_messages.py).
- `tenants.py`: GET and POST /api/v1/tenants, GET and PATCH /api/v1/tenants/<name>.
- `tokens.py`: GET and POST /api/v1/tokens, POST /api/v1/tokens/<id>/revoke.
"""
