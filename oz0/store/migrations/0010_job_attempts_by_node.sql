-- A node's page lists the attempts that ran on it, newest first: without this, each view
-- reads every attempt of the cluster.
CREATE INDEX job_attempts_by_node ON job_attempts (node_id, started_at DESC);
