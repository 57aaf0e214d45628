-- `operator add` / `operator enroll` (oz0/enrollment.py). An enrollment row stays once its
-- code is used (used_at), so a second use is told "already used" rather than "wrong"; the
-- next `operator add` of the name, or `operator remove`, deletes it.
ALTER TABLE operator_enrollments ADD COLUMN used_at timestamptz;

-- Refused enrollment codes, counted per source address over a window (as sign-ins are),
-- so that guessing codes stops at a limit on every server alike. Rows older than the
-- window are pruned as new ones come.
CREATE TABLE operator_enroll_failures (
    id bigserial PRIMARY KEY,
    source text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_enroll_failures_source ON operator_enroll_failures (source, at);
CREATE INDEX operator_enroll_failures_at ON operator_enroll_failures (at);
