-- Listings page by keyset in (joined_at, id) order (`node list`, GET /api/v1/nodes, the
-- web UI's /nodes): one index per filter that reads a page in that order and stops, at
-- 50,000 nodes and beyond. (state, ...) and (tenant, ...) replace the single-column
-- indexes, which they cover (the pending count of tokenless joins reads the first).
CREATE INDEX nodes_listing ON nodes (joined_at, id);
CREATE INDEX nodes_state_listing ON nodes (state, joined_at, id);
CREATE INDEX nodes_tenant_listing ON nodes (tenant, joined_at, id);
DROP INDEX nodes_state;
DROP INDEX nodes_tenant;
-- Label filters: `labels @> '{"k": "v"}'` and `labels ? 'k'` (jsonb_ops has both).
CREATE INDEX nodes_labels ON nodes USING gin (labels);
-- The search (a part of the ID or host name, any case) reads rows in listing order until
-- a page is full; lower() of every host name was most of its cost, so it is kept. (An
-- index for substrings, pg_trgm's, is not there on every PostgreSQL we run on: the
-- embedded one of dev mode lacks the extension.)
ALTER TABLE nodes ADD COLUMN hostname_lower text GENERATED ALWAYS AS (lower(hostname)) STORED;

-- A page of the audit log is JSON written by PostgreSQL (oz0.audit.entries_page_json),
-- as the API's encoder writes it: the keys of every object sorted (jsonb keeps them in
-- its own order, shortest first).
CREATE FUNCTION oz0_sorted_json(value jsonb) RETURNS json LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(value) = 'object' THEN
        RETURN coalesce((SELECT json_object_agg(k, oz0_sorted_json(v) ORDER BY k COLLATE "C")
                         FROM jsonb_each(value) AS e (k, v)), '{}'::json);
    ELSIF jsonb_typeof(value) = 'array' THEN
        RETURN coalesce((SELECT json_agg(oz0_sorted_json(v) ORDER BY n)
                         FROM jsonb_array_elements(value) WITH ORDINALITY AS e (v, n)), '[]'::json);
    END IF;
    RETURN value::json;
END $$;
