-- Parts of a job as rows sent over the node's control stream (issue 41), not Temporal
-- activities. Expand only: a server of the previous release beside this one places every
-- attempt the old way (it never sets jobs.streamed), and a job's workflow is started
-- streaming only once every server up is at this schema (oz0/jobs/inputs.py).
--
-- jobs.streamed: its workflow was started streaming; placement sends its attempts over the
--   stream of every node that takes them so (nodes.attempts_by_stream).
-- nodes.attempts_by_stream: the node's agent said, on its control stream, that it takes
--   attempts there (an older agent never says: its attempts stay Temporal activities).
-- job_attempts.streamed: this attempt goes over the stream; `sent` is the attempt message
--   (command, environment, its grant and sealed secrets, as an activity's input had them;
--   the sealed secrets dropped when it ends); `part_end` is how the node said it ended
--   (oz0/jobs/parts.py, PartEnd), and end_signalled whether the job's workflow was told.
ALTER TABLE jobs ADD COLUMN streamed boolean NOT NULL DEFAULT false;
ALTER TABLE nodes ADD COLUMN attempts_by_stream boolean NOT NULL DEFAULT false;
ALTER TABLE job_attempts ADD COLUMN streamed boolean NOT NULL DEFAULT false;
ALTER TABLE job_attempts ADD COLUMN sent jsonb;
ALTER TABLE job_attempts ADD COLUMN part_end jsonb;
ALTER TABLE job_attempts ADD COLUMN end_signalled boolean NOT NULL DEFAULT false;
-- The sweeper's look for streamed parts ended but not told (edge signal lost) and for
-- those whose node fell silent: both among the few rows of this index.
CREATE INDEX job_attempts_streamed_open ON job_attempts (job_id, number)
    WHERE streamed AND (state = 'running' OR NOT end_signalled);
