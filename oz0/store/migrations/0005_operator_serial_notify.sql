-- Temporal makes an operator admin only with its current certificate: every server pushes
-- the operators' serials to its Temporal host. A change of an operator's certificate (issue,
-- renew, re-issue) or its removal notifies `oz0_operators` with the operator's name in the
-- same transaction, whoever writes; servers also re-read the table every second, so a lost
-- notification still meets the two-second bound.
CREATE FUNCTION operators_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oz0_operators', coalesce(NEW.name, OLD.name));
    RETURN NULL;
END $$;

CREATE TRIGGER operators_notify_insert_delete AFTER INSERT OR DELETE ON operators
    FOR EACH ROW EXECUTE FUNCTION operators_notify();
CREATE TRIGGER operators_notify_update AFTER UPDATE ON operators
    FOR EACH ROW
    WHEN (OLD.cert_serial IS DISTINCT FROM NEW.cert_serial OR OLD.name IS DISTINCT FROM NEW.name)
    EXECUTE FUNCTION operators_notify();
