-- oz0: contract
-- (The unique index refuses what servers before it could insert; the servers of its release
-- re-seal the CA keys in a form earlier ones cannot open.)
-- One key is one node, however many joins race (the second insert fails and sees the
-- first). A database that already holds two nodes for one key is refused, not guessed
-- at: the operator deletes one of them with `node delete`, then upgrades.
DO $$
DECLARE
    twice integer;
BEGIN
    SELECT count(*) INTO twice FROM (
        SELECT public_key_sha256 FROM nodes WHERE public_key_sha256 IS NOT NULL
        GROUP BY public_key_sha256 HAVING count(*) > 1
    ) AS duplicates;
    IF twice > 0 THEN
        RAISE EXCEPTION '% node keys belong to more than one node; run `orchestrator-zero node list`, delete the extra nodes with `node delete`, then upgrade again', twice;
    END IF;
END
$$;
DROP INDEX nodes_public_key_sha256;
CREATE UNIQUE INDEX nodes_public_key_sha256 ON nodes (public_key_sha256);

-- Sealed secrets name what they are in their associated data from seal version 2 on.
-- Clusters sealed before are re-sealed by the first `server start` with the master key.
ALTER TABLE cluster ADD COLUMN seal_version smallint NOT NULL DEFAULT 1
    CHECK (seal_version IN (1, 2));
