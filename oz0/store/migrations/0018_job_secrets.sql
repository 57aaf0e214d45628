-- Jobs' secret environment (issue 29): each value sealed with the master key, bound to the
-- cluster, its job and its name (pki.Sealed.JOB_SECRET), in a table of its own so that no
-- listing of jobs ever reads it; the rows go in the transaction that ends the job. The job
-- keeps only the names, to show.
ALTER TABLE jobs ADD COLUMN secret_env jsonb NOT NULL DEFAULT '[]'::jsonb;

CREATE TABLE job_secrets (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name text NOT NULL,
    sealed bytea NOT NULL,
    PRIMARY KEY (job_id, name)
);
