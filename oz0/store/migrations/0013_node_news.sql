-- oz0: contract
-- (Servers before it do not understand the new notification.)
-- A block ends the node's control stream on whichever server holds it. The notification
-- on `oz0_nodes` now carries what that server needs to act at once, without reading the
-- node back (at 10,000 streams per server the read back waited 5-44 ms for the
-- interpreter's lock): `ID STATE KEY REVISION`, the key's SHA-256 `-` while the node has
-- none, the state `deleted` once the row is gone (with the revision it had). Revisions of
-- one node rise in the order of its commits, so a server skips news older than what it
-- read (oz0/server/events.py, NodeNews).
CREATE OR REPLACE FUNCTION nodes_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('oz0_nodes', concat_ws(' ',
            OLD.id, 'deleted', coalesce(OLD.public_key_sha256, '-'), OLD.revision));
    ELSE
        PERFORM pg_notify('oz0_nodes', concat_ws(' ',
            NEW.id, NEW.state, coalesce(NEW.public_key_sha256, '-'), NEW.revision));
    END IF;
    RETURN NULL;
END $$;
