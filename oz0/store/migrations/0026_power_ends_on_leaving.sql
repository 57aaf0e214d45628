-- oz0: expand
-- A person's power ends when they leave (issue 42, oz0/leaving.py): removing or demoting a
-- person pauses their schedules, revokes their join tokens and cancels the enrollments they
-- made, in the transaction that removes or changes them. Expand only: a server of the
-- previous release ignores the new columns; a cancelled enrollment is also made to expire
-- at once, and a revoked token is an ordinary revoked one, so that server refuses both.
--
-- schedules.owner: whose name its runs start jobs in ("operator:bob") once an admin took it
--   over (`schedule set ID --owner NAME`); NULL: its creator (created_by).
-- schedules.paused_reason: why it is paused until an admin takes it over ("its creator
--   alice was removed"); its runs start nothing while it is set (schedules.start_run).
-- operator_enrollments.cancelled: why the code no longer works ("its maker alice was
--   removed"), told to the person who tries it.
ALTER TABLE schedules ADD COLUMN owner text;
ALTER TABLE schedules ADD COLUMN paused_reason text;
ALTER TABLE operator_enrollments ADD COLUMN cancelled text;

-- A person's live tokens, found by their maker when the person leaves.
CREATE INDEX join_tokens_live_by_creator ON join_tokens (created_by) WHERE revoked_at IS NULL;
