-- The audit log is filtered by actor (the web UI's Audit page, `audit list --actor`), as it
-- already is by action and target: newest first within one actor's rows.
CREATE INDEX audit_log_actor ON audit_log (actor, id);
