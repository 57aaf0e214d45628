-- Resource limits per job (issue 29): what `job run --memory/--cpu/--max-processes/
-- --max-open-files/--max-address-space` asked, sizes in bytes, only the keys asked
-- (oz0/jobs/limits.py); each attempt's node gets them. What the node says it applied to an
-- attempt (as which user, how it tracks the attempt's processes, how each limit was set or
-- why not) is kept with the attempt; null when the node said nothing (an older agent, or an
-- attempt that ended without the node's answer).
ALTER TABLE jobs ADD COLUMN limits jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE job_attempts ADD COLUMN applied jsonb;
