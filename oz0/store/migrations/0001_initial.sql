-- The cluster: exactly one row, its CAs sealed with the master key.
CREATE TABLE cluster (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    name text NOT NULL,
    history_shards integer NOT NULL CHECK (history_shards > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    cluster_ca_cert text NOT NULL,
    cluster_ca_key_sealed bytea NOT NULL,
    internode_ca_cert text NOT NULL,
    internode_ca_key_sealed bytea NOT NULL
);

-- One row per running server process; "up" means a recent heartbeat.
CREATE TABLE servers (
    id text PRIMARY KEY,
    advertise text NOT NULL,
    version text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX servers_last_heartbeat ON servers (last_heartbeat);

CREATE TABLE tenants (
    name text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- An operator holds exactly one valid certificate: the one whose serial is stored here.
-- Renewing or re-issuing replaces it, so a lost or superseded certificate stops working.
CREATE TABLE operators (
    name text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    cert_serial numeric(50, 0) NOT NULL,
    cert_not_after timestamptz NOT NULL
);

CREATE TABLE ui_accounts (
    username text PRIMARY KEY,
    password_hash text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE audit_log (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor_kind text NOT NULL CHECK (actor_kind IN ('operator', 'node', 'server')),
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    details jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_action ON audit_log (action, id);
CREATE INDEX audit_log_target ON audit_log (target, id);
