-- A placeholder on branch job-secrets only, so that its 0019 follows without a gap: this
-- number belongs to another part of issue 29, whose migration replaces this file at merge.
SELECT 1;
