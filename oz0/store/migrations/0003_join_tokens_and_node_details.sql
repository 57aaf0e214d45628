-- Join tokens: the secret is kept only as its SHA-256 (it is 32 random bytes, so a
-- slow hash adds nothing). max_uses 0 = unlimited, expires_at NULL = never.
CREATE TABLE join_tokens (
    id text PRIMARY KEY CHECK (id ~ '^tok-[0-9a-f]{12}$'),
    secret_sha256 bytea NOT NULL,
    tenant text NOT NULL REFERENCES tenants (name),
    labels jsonb NOT NULL DEFAULT '{}'::jsonb,
    description text NOT NULL DEFAULT '',
    max_uses integer NOT NULL CHECK (max_uses >= 0),
    uses integer NOT NULL DEFAULT 0 CHECK (uses >= 0),
    expires_at timestamptz,
    revoked_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL
);

-- What a node told us when it joined, what we gave it, and where it is connected.
ALTER TABLE nodes
    ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN hostname text NOT NULL DEFAULT '',
    ADD COLUMN token_id text REFERENCES join_tokens (id),
    ADD COLUMN reason text,
    -- The node's P-256 public key (PEM) from its certificate request, and its SHA-256.
    ADD COLUMN public_key text,
    ADD COLUMN public_key_sha256 text,
    -- The certificate issued on acceptance, kept until the node has picked it up.
    ADD COLUMN certificate text,
    ADD COLUMN server text,
    ADD COLUMN last_seen timestamptz;
CREATE INDEX nodes_state ON nodes (state);
-- A repeated join finds the node by its key.
CREATE INDEX nodes_public_key_sha256 ON nodes (public_key_sha256);
CREATE INDEX nodes_tenant ON nodes (tenant);

-- The edge refreshes last_seen and server for thousands of nodes every few seconds;
-- only a change of state or tenant is news to other servers.
DROP TRIGGER nodes_revision ON nodes;
DROP TRIGGER nodes_notify ON nodes;
CREATE TRIGGER nodes_revision BEFORE UPDATE ON nodes
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.tenant IS DISTINCT FROM NEW.tenant)
    EXECUTE FUNCTION nodes_bump_revision();
CREATE TRIGGER nodes_notify_insert_delete AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_notify();
CREATE TRIGGER nodes_notify_update AFTER UPDATE ON nodes
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.tenant IS DISTINCT FROM NEW.tenant)
    EXECUTE FUNCTION nodes_notify();
