-- oz0: expand
-- The audit log followed (GET /api/v1/events, oz0/audit_stream.py; issue 45). Row ids are
-- taken at INSERT but their transactions commit later and in any order, so "id above the
-- last one read" would skip a row whose transaction commits after a higher id was read.
-- Each row now names the transaction that wrote it (xid8, never wrapping): a follower
-- reads only rows of transactions older than every one still running
-- (pg_snapshot_xmin(pg_current_snapshot())), all complete, in (xid, id) order.
--
-- audit_log.xid: the writing transaction. Rows older than this migration read as '0'
--   (complete long ago, in id order): a constant default adds the column without
--   rewriting the table; new rows get their transaction's, whichever server writes them
--   (one of the previous release names no xid, so the default gives it).
ALTER TABLE audit_log ADD COLUMN xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE audit_log ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX audit_log_stream ON audit_log (xid, id);

-- Followers wait on `oz0_audit`: one notification a transaction that wrote rows (PostgreSQL
-- folds the same payload on one channel into one), delivered at its commit.
CREATE FUNCTION audit_log_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oz0_audit', '');
    RETURN NULL;
END $$;
CREATE TRIGGER audit_log_notify AFTER INSERT ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_notify();
