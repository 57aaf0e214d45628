"""Defaults of `server start`'s options that `orchestrator-zero server start --help` shows.

Here, apart from the server's modules that use them, so that the command line can show
them without loading the server (trio, psycopg, temporalio, the web stack).
"""

from __future__ import annotations

# Seconds between the edge's checks that every streamed node is still accepted: the
# backstop for a lost notification (oz0/server/edge/tracking.py).
RECONCILE_EVERY = 1.0

# What one person may hold or ask of one server (oz0/server/person_limits.py; the refusals'
# lines: oz0/cap_rules.py). Web sessions are counted cluster-wide, against each server's
# own flag: give every server the same.
MAX_WEB_SESSIONS_PER_PERSON = 20
# A tenth of a server's MAX_STREAMS (oz0/web/live.py): ten people fill it, not one.
MAX_LIVE_PAGES_PER_PERSON = 20
# Streams of the audit log (GET /api/v1/events, `audit follow`) one person may hold on one
# server: a forwarder and a terminal or two, not a leak that fills the server's 200.
MAX_EVENT_STREAMS_PER_PERSON = 5
# A token bucket per person and server: REQUEST_BURST at once, refilled at this rate. One
# request costs about one pooled connection for a few milliseconds, so one person at the
# rate holds a fraction of the server's 8 (oz0/store/pool.py).
PERSON_REQUESTS_PER_SECOND = 50.0
PERSON_REQUEST_BURST = 200
