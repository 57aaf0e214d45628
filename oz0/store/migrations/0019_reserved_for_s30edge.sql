-- Placeholder so that this branch (s30ret) numbers its migrations without a gap: 0019 is
-- s30edge's (jobs.on_lost, jobs.lost_after). Deleted when that branch is merged.
SELECT 1;
