-- Schedules (issue 31): a job run on a cron or an interval by a Temporal Schedule in the
-- tenant's namespace (oz0/jobs/schedules.py). This table is what `schedule list` reads
-- with the operator's tenant scope, and what each run reads the job from; Temporal holds
-- the timing and whether it is paused. Expand only: an older server ignores the table, the
-- new columns of `jobs` (nullable) and the wider actor kinds.
CREATE TABLE schedules (
    id text PRIMARY KEY CHECK (id ~ '^sched-[0-9a-f]{12}$'),
    tenant text NOT NULL REFERENCES tenants (name),
    -- When and how (cron or every, time zone, overlap, catch-up window, pause on failure)
    -- and the job's spec as the API took it (never secrets: a schedule may not hold any).
    spec jsonb NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedules_listing ON schedules (tenant, created_at DESC);

-- A scheduled run's job: which schedule made it, and the run's key (its Temporal workflow
-- ID and run ID), unique, so that a step run twice makes one job.
ALTER TABLE jobs ADD COLUMN schedule_id text;
ALTER TABLE jobs ADD COLUMN run_key text;
CREATE UNIQUE INDEX jobs_run_key ON jobs (run_key) WHERE run_key IS NOT NULL;
CREATE INDEX jobs_by_schedule ON jobs (schedule_id, created_at DESC)
    WHERE schedule_id IS NOT NULL;

-- A scheduled job's `job.run` is audited as done by `schedule:<id>`. NOT VALID, then
-- validated: the scan takes no lock that stops writes to the log.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_actor_kind_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_actor_kind_check
    CHECK (actor_kind IN ('operator', 'node', 'server', 'ui', 'schedule')) NOT VALID;
ALTER TABLE audit_log VALIDATE CONSTRAINT audit_log_actor_kind_check;
