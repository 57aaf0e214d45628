// Live updates: filled in by oz0/web/live.py's server-sent events.
