-- People, roles and tenants (issue 28). Every operator has a role and the tenants it may
-- reach (none listed: every tenant, a cluster-wide operator). Operators made before this
-- migration were all root on everything: they stay cluster-wide admins.
ALTER TABLE operators
    ADD COLUMN role text NOT NULL DEFAULT 'admin'
        CHECK (role IN ('viewer', 'operator', 'admin')),
    ADD COLUMN tenants text[] NOT NULL DEFAULT '{}',
    ADD COLUMN last_used_at timestamptz;

-- A change of role or tenants is news to every server as a new certificate is: the API's
-- cache, the web UI and the Temporal host act on it within two seconds.
DROP TRIGGER operators_notify_update ON operators;
CREATE TRIGGER operators_notify_update AFTER UPDATE ON operators
    FOR EACH ROW
    WHEN (OLD.cert_serial IS DISTINCT FROM NEW.cert_serial OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.role IS DISTINCT FROM NEW.role OR OLD.tenants IS DISTINCT FROM NEW.tenants)
    EXECUTE FUNCTION operators_notify();

-- `operator add` makes a one-time enrollment code, kept only as its SHA-256; enrolling
-- makes the operator row and deletes this one.
CREATE TABLE operator_enrollments (
    name text PRIMARY KEY,
    code_sha256 text NOT NULL UNIQUE,
    role text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    tenants text[] NOT NULL DEFAULT '{}',
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- Which tenants an audit row is about (none: the cluster as a whole); a person scoped to
-- tenants sees only rows about them.
ALTER TABLE audit_log ADD COLUMN tenants text[] NOT NULL DEFAULT '{}';
UPDATE audit_log a SET tenants = ARRAY[n.tenant]
    FROM nodes n WHERE a.target = 'node:' || n.id;
UPDATE audit_log a SET tenants = ARRAY[j.tenant]
    FROM jobs j WHERE a.target = 'job:' || j.id;
UPDATE audit_log a SET tenants = ARRAY[t.tenant]
    FROM join_tokens t WHERE a.target = 'token:' || t.id;
UPDATE audit_log SET tenants = ARRAY[substr(target, 8)] WHERE target LIKE 'tenant:%';
CREATE INDEX audit_log_tenants ON audit_log USING gin (tenants);
