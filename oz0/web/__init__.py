"""The web UI on 8443, served by every server beside the JSON API.

- `sign_in.py`: sign-in and sign-out, and the rate limit on failed sign-ins; the sessions
  themselves, in PostgreSQL with idle and absolute expiry and their CSRF tokens, are
  `oz0/ui_sessions.py`.
- `routes.py`: the pages; each action calls the same functions the JSON API calls.
- `headers.py`: the security headers every page gets.
- `templates/`, `static/`: Jinja2 templates (autoescaped) and our own CSS; no CDN.

Also here:

- `account.py`: /account: the signed-in account, and Change password (the current one
  checked as a sign-in is, so a wrong one counts toward the same rate limit).
- `admin_pages.py`: /tenants (the list, and Create tenant through the API's own code) and
  /servers (every server's row, up or down by membership's heartbeat window).
- `audit_pages.py`: /audit: the audit log, newest first, filtered by action, actor and
  target in the URL, paged by a cursor on the id (`?before=ID`), so a page stays cheap
  however deep.
- `form_fields.py`: a form's text fields as a JSON body would hold them, for the pages that
  hand a form to the same checks as the API (TokenSpec.from_json, JobSpec.from_json).
- `job_pages.py`: /jobs: the list (filters and pages in the URL), a job with its attempts
  and output (jobs.js follows a running one through /jobs/<id>/live.json), cancelling one,
  and /jobs/new, the form that runs one.
- `live.py`: GET /ui/events: server-sent events that keep a page's nodes current without a
  reload.
- `live_others.py`: which changed nodes a live list of a person of some tenants may hear of.
- `node_pages.py`: /nodes (the fleet, filtered and paged in the URL), /nodes/<id> (one node:
  its fields, its audit history, its jobs and the actions its state allows), the actions'
  posts.
- `overview.py`: /overview: nodes by tenant and state (each count a link to that list), the
  servers up with their Temporal state, the latest audit entries.
- `pages.py`: what every page module of the web UI shares: the signed-in session, guarded
  form posts, rendering with the layout's facts, and the notice shown after an action.
- `paging.py`: `?page=N` for lists of the web UI: which page, and the links to its
  neighbours.
- `schedule_pages.py`: /schedules: the list (with pause, unpause, trigger and delete), and
  the form that makes one (when it runs, then the same job fields as the run form).
- `session_pages.py`: /sessions: sessions on nodes, the live ones first; /sessions/ID: one,
  and for the admins of its tenant its recording in a terminal view: the screen it left.
- `terminal_frames.py`: what a session's terminal showed over time, from its asciicast v2
  recording: its output events fed to a VT100 emulator (pyte) of the recorded size, resizes
  followed, as frames (the lines that changed).
- `token_pages.py`: /tokens: the join tokens, creating one (its secret and join command
  shown once), and revoking one (a confirm page first; tokens.js makes it a dialog).
"""
