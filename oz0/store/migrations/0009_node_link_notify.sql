-- The web UI shows a node's connection live, on every server: a node's server changing
-- (connected to one, moved to another, disconnected) notifies `oz0_node_links` with the
-- node's ID. The edge's heartbeat writes keep the same server and notify nothing; a node
-- going silent changes no row, so the UI also re-reads what it shows every second.
CREATE FUNCTION nodes_notify_link() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oz0_node_links', NEW.id);
    RETURN NULL;
END $$;

CREATE TRIGGER nodes_notify_link AFTER UPDATE OF server ON nodes
    FOR EACH ROW
    WHEN (OLD.server IS DISTINCT FROM NEW.server)
    EXECUTE FUNCTION nodes_notify_link();
