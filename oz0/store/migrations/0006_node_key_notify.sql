-- Temporal takes a node's calls only with its current certificate: every server pushes the
-- key hash of each node's certificate to its Temporal host with the node table. A renewal
-- (a new key) or a first certificate (accept) is therefore news to other servers, as a
-- change of state or tenant is: it takes a fresh revision and notifies `oz0_nodes` in the
-- same transaction, whoever writes, so the host refuses the old certificate within two
-- seconds and control streams opened with it are ended. The edge's frequent writes
-- (last_seen, server) still bump nothing.
DROP TRIGGER nodes_revision ON nodes;
DROP TRIGGER nodes_notify_update ON nodes;
CREATE TRIGGER nodes_revision BEFORE UPDATE ON nodes
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.tenant IS DISTINCT FROM NEW.tenant
          OR OLD.public_key_sha256 IS DISTINCT FROM NEW.public_key_sha256
          OR (OLD.certificate IS NULL) IS DISTINCT FROM (NEW.certificate IS NULL))
    EXECUTE FUNCTION nodes_bump_revision();
CREATE TRIGGER nodes_notify_update AFTER UPDATE ON nodes
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.tenant IS DISTINCT FROM NEW.tenant
          OR OLD.public_key_sha256 IS DISTINCT FROM NEW.public_key_sha256
          OR (OLD.certificate IS NULL) IS DISTINCT FROM (NEW.certificate IS NULL))
    EXECUTE FUNCTION nodes_notify();
