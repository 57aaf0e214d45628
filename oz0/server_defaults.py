"""Defaults of `server start`'s options that `orchestrator-zero server start --help` shows.

Here, apart from the server's modules that use them, so that the command line can show
them without loading the server (trio, psycopg, temporalio, the web stack).
"""

from __future__ import annotations

# Seconds between the edge's checks that every streamed node is still accepted: the
# backstop for a lost notification (oz0/server/edge/tracking.py).
RECONCILE_EVERY = 1.0
