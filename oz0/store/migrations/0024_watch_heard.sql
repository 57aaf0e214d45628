-- No change to the tables: this schema marks the release whose job workers have the step
-- that looks for attempts no node heard of (oz0/jobs/heard.py). A job's workflow is
-- started watching for them only once every server up is at this schema or later
-- (oz0/jobs/inputs.py, WATCH_HEARD_SCHEMA), since a worker of an older release could not
-- replay its history.
SELECT 1;
