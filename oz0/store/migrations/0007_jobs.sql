-- Jobs: commands run on the fleet through Temporal (oz0/jobs/). A job is a workflow in its
-- tenant's namespace, started by whichever server first sees the row without one
-- (`workflow_started`); these rows are what operators list and show, written by the
-- workflow's activities as it goes.
CREATE TABLE jobs (
    id text PRIMARY KEY CHECK (id ~ '^job-[0-9a-f]{12}$'),
    tenant text NOT NULL REFERENCES tenants (name),
    name text,
    command jsonb NOT NULL,
    selector jsonb NOT NULL DEFAULT '{}'::jsonb,
    node text,
    all_nodes boolean NOT NULL DEFAULT false,
    env jsonb NOT NULL DEFAULT '{}'::jsonb,
    timeout_s double precision,
    queue_timeout_s double precision NOT NULL,
    retries integer NOT NULL DEFAULT 0,
    no_move boolean NOT NULL DEFAULT false,
    state text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'lost')),
    reason text,
    exit_code integer,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    ended_at timestamptz,
    workflow_started boolean NOT NULL DEFAULT false,
    -- A server starting the workflow holds the row until then; past it, another may.
    start_claimed_until timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    cancel_sent boolean NOT NULL DEFAULT false
);
CREATE INDEX jobs_listing ON jobs (tenant, created_at DESC);
CREATE INDEX jobs_by_state ON jobs (state, created_at DESC);
-- What every server's sweeper looks for twice a second: small partial indexes.
CREATE INDEX jobs_unstarted ON jobs (created_at) WHERE NOT workflow_started;
CREATE INDEX jobs_to_cancel ON jobs (id) WHERE cancel_requested AND NOT cancel_sent;

-- One row per attempt: where it ran and how it ended. `part` numbers the node of a job
-- run on all matching nodes (--all); other jobs have one part, 0.
CREATE TABLE job_attempts (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    number integer NOT NULL CHECK (number > 0),
    part integer NOT NULL DEFAULT 0,
    node_id text NOT NULL,
    state text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'ended')),
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    exit_code integer,
    ended_because text,
    output_bytes bigint NOT NULL DEFAULT 0,
    truncated boolean NOT NULL DEFAULT false,
    removal_signalled boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, number)
);
CREATE INDEX job_attempts_running ON job_attempts (node_id) WHERE state = 'running';

-- Output as it came, in order of `id` (the cursor `job logs --follow` pages by); `seq` is
-- the node's own numbering within the attempt, so a chunk sent twice is stored once.
CREATE TABLE job_output (
    id bigserial PRIMARY KEY,
    job_id text NOT NULL,
    attempt integer NOT NULL,
    seq integer NOT NULL,
    stream text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    data bytea NOT NULL,
    truncated boolean NOT NULL DEFAULT false,
    at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, attempt, seq),
    FOREIGN KEY (job_id, attempt) REFERENCES job_attempts (job_id, number) ON DELETE CASCADE
);
CREATE INDEX job_output_by_job ON job_output (job_id, id);
