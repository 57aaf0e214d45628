-- What a job does when the node running its attempt is lost (issue 30): `move` it to
-- another node (what every job did before), `wait` for the node to come back, or `fail`;
-- and after how long without news from the node it counts as lost (null: the default for
-- its on_lost, oz0/jobs/spec.py). Expand only: an older server beside this one inserts
-- neither column, and its jobs move after the default, as before.
ALTER TABLE jobs ADD COLUMN on_lost text NOT NULL DEFAULT 'move'
    CHECK (on_lost IN ('move', 'wait', 'fail'));
ALTER TABLE jobs ADD COLUMN lost_after_s double precision;
