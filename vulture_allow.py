"""What vulture (`nox -s lint`, configured in pyproject.toml) would call dead but is kept on
purpose: each name below is used where vulture does not look. A name added here says why.

vulture reads the product's Python (oz0, oz0_node, oz0_common, cli) alone, then again with
the tests, their support (fixtures) and the benchmarks (bench), whose dead names it then
reports (a product name that only tests use is dead in the first run). Routes, CLI
commands and workflow signals are registered by their decorators (pyproject's
`ignore_decorators`), so they are not listed. What is left: names read by templates, JSON
keys, attributes other libraries read, and hooks for the tests. This file is never run.
"""

# ruff: noqa: B018 (each line is a name for vulture to count as used, nothing else)
from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# --- Called by a library with a fixed signature
# cyclopts passes a converter the parameter's type first (cli/job_params.py,
# cli/tenant_cmds.py, cli/cluster_cmds.py); the converters read the tokens only.
_.type_
# PEP 562: `from oz0_node.jobs import X` loads X's module on first use.
_.__getattr__

# --- Attributes another library reads
_.itersize  # psycopg: rows a named cursor fetches at once (oz0/node_sessions.py)
_.keep_alive_timeout  # hypercorn's Config (oz0/server/https.py)
_.h11_max_incomplete_size  # hypercorn's Config
_.ssl_handshake_timeout  # hypercorn's Config
_.accesslog  # hypercorn's Config
_.request_class  # Quart: the Request class of every request (oz0/server/management.py)
_.tempdir  # tempfile's cache of $TMPDIR, reset in a forked process (fixtures/zygotes.py)
_.merge_slashes  # werkzeug's url Map (oz0/server/management.py)
_.strict_slashes  # werkzeug's url Map
_.num_tickets  # ssl.SSLContext: session tickets a TLS 1.3 server sends (oz0/server/tls.py)

# --- Read by Jinja templates (oz0/web/templates/)
_.ui_ca_fingerprint  # sign_in.html (oz0/cluster.py)
_.job_name  # node.html: oz0.jobs.store.NodeAttempt
_.job_state  # node.html: oz0.jobs.store.NodeAttempt

# --- Keys of JSON the API and the CLI give (TypedDicts): read by clients, never by name
# in Python (the API describes them from these TypedDicts: oz0/server/api/openapi.py)
_.waiting_nodes  # oz0/jobs/store/_records.py PartsJson
_.session_idle_timeout_seconds  # oz0/node_sessions.py SettingsJson
_.session_max_seconds  # oz0/node_sessions.py SettingsJson
_.certificate_not_after  # oz0/operators.py OperatorJson
_.audit_retention_seconds  # oz0/server/api/cluster.py ClusterSettings
_.chunks_per_upload  # oz0/server/api/files.py Upload
_.ca_certificate  # oz0/server/api/operators.py Pinned
_.schedules_paused  # oz0/server/api/operators.py Ended
_.tokens_revoked  # oz0/server/api/operators.py Ended
_.enrollments_cancelled  # oz0/server/api/operators.py Ended
_.ended_elsewhere  # oz0/server/api/operators.py Ended
_.schedules_not_paused_in_temporal  # oz0/server/api/operators.py Ended
_.web_account  # oz0/server/api/operators.py Removed
_.previous_owner  # oz0/server/api/schedules.py GivenAway
_.asciicast  # oz0/server/api/session_records.py SessionRecording
_.job_retention_seconds  # oz0/tenants.py TenantJson
_.min_schedule_interval_seconds  # oz0/tenants.py TenantJson
_.exit_codes  # cli/job_recap.py RecapJson: `job run --json`

# --- For the tests: what they observe, or the simple form a fast path is checked against
_.entries_page  # oz0/audit.py: what entries_page_json must give (tests/test_listings.py)
_.consume  # oz0/tokens.py: one join's use; Ledger must admit as it does (tests/test_tokens.py)
_.last_screen  # oz0/web/terminal_frames.py: what the pages must replay to (test_terminal_frames)
_.kept_bytes  # oz0/file_blob_cache.py: the cache's bound (tests/test_file_blobs.py)
_.created_databases  # oz0/cluster_init.py: a second init creates none (tests/test_init.py)
_.worker_finished  # oz0_node/runtime.py (tests/test_runtime_worker_shutdown.py)
_.stop_being_subreaper  # oz0_node/jobs/tracking.py: the test session's teardown (conftest)
_.DEFAULT_JOB_USER  # oz0_node/jobs/job_user.py: the docs' --job-user (fixtures/job_user.py)

# --- The tests, the test support and the benchmarks (the second run of `nox -s lint`)
_.before_the_patch  # tests/test_jobs_before_upgrade.py: a fixture asked for its effect only
_.shutting_down  # tests/test_suite_scopes.py: read by xdist's scheduler of a worker
_.send_runtest_some  # tests/test_suite_scopes.py: called by xdist's scheduler
_.on_heartbeat  # temporalio's ActivityEnvironment calls it (tests/test_node_attempt_link.py)
_.logfile_read  # pexpect writes what it reads there (tests/test_sessions_e2e.py)
