-- How many attempts a node runs at once (`oz0-node start --max-jobs N`, issue 30): the node
-- says so on each control stream and job placement (oz0/jobs/placement.py) puts no more
-- on it. Expand only: an older server beside this one writes none and places at most 4 on
-- any node, and an older agent never says, so its node keeps the default, what it runs.
ALTER TABLE nodes ADD COLUMN max_jobs integer NOT NULL DEFAULT 4
    CHECK (max_jobs BETWEEN 1 AND 256);
