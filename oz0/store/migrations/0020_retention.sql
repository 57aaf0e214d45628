-- History kept as long as asked (issue 30); expand only: an older server runs beside it.
-- Each tenant's job retention (finished jobs older than it are deleted with their
-- attempts, output and secrets, oz0/jobs/pruner.py) and its cap on jobs queued at once
-- (`job run` beyond it is refused, oz0/jobs/store.py). Bounds: oz0/retention_rules.py.
ALTER TABLE tenants
    ADD COLUMN job_retention_s bigint NOT NULL DEFAULT 2592000 CHECK (job_retention_s > 0),
    ADD COLUMN max_queued_jobs integer NOT NULL DEFAULT 10000 CHECK (max_queued_jobs > 0);

-- Cluster-wide settings and the pruner's schedule: one row. audit_retention_s NULL: the
-- audit log is kept for ever. prune_due_at: when the next pruning pass is due; the server
-- that moves it forward does the pass, so one server prunes at a time.
CREATE TABLE cluster_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    audit_retention_s bigint CHECK (audit_retention_s > 0),
    prune_due_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO cluster_settings DEFAULT VALUES;

-- The pruner's question (a tenant's jobs that ended before a time) and `job run`'s (how
-- many of a tenant's jobs are queued), each a small partial index.
CREATE INDEX jobs_ended ON jobs (tenant, ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX jobs_queued ON jobs (tenant) WHERE state = 'queued';
