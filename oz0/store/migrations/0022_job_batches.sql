-- Rolling batches (`job run --all --batch N|P%`, issue 31): at most `batch` parts of the
-- job run at once ("N" or "P%" of the matching nodes), each slot idle `batch_wait_s` after
-- its part ends, and no new part starts once more than `max_failures` ("N" or "P%") have
-- failed. Null `batch`: every part at once, as before. Expand only: an older server beside
-- this one writes none of them, and its --all jobs run as they always did.
ALTER TABLE jobs ADD COLUMN batch text CHECK (batch ~ '^[0-9]+%?$');
ALTER TABLE jobs ADD COLUMN batch_wait_s double precision NOT NULL DEFAULT 0
    CHECK (batch_wait_s >= 0);
ALTER TABLE jobs ADD COLUMN max_failures text CHECK (max_failures ~ '^[0-9]+%?$');

-- A batch job's parts, one per node matched when it started: `waiting` for a slot, then
-- `placed` (its attempts are in job_attempts, `part` the same), or `not started`, with why
-- (its node was blocked, purged or deleted meanwhile; the job ended first). A part holds
-- no attempt, and so no grant that could expire, until its slot opens.
CREATE TABLE job_parts (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    part integer NOT NULL CHECK (part >= 0),
    node_id text NOT NULL,
    state text NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'placed', 'not started')),
    because text,
    PRIMARY KEY (job_id, part)
);
