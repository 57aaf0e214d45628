-- oz0: expand
-- Caps per tenant (issue 42; oz0/cap_rules.py, enforced by oz0/tenant_caps.py), each set
-- with `tenant create/set`: how many schedules it may have, the shortest time between two
-- runs of one of them (Temporal takes a second; cron counts minutes), and how many of its
-- join tokens may still let a node in at once. Expand only: an older server beside this
-- one inserts tenants without them (the defaults hold) and enforces none.
ALTER TABLE tenants
    ADD COLUMN max_schedules integer NOT NULL DEFAULT 100 CHECK (max_schedules > 0),
    ADD COLUMN min_schedule_interval_s integer NOT NULL DEFAULT 60
        CHECK (min_schedule_interval_s > 0),
    ADD COLUMN max_join_tokens integer NOT NULL DEFAULT 100 CHECK (max_join_tokens > 0);

-- `schedule create` counts its tenant's schedules (schedules_listing leads with tenant);
-- `token create` its tenant's tokens that still let a node in.
CREATE INDEX join_tokens_live ON join_tokens (tenant) WHERE revoked_at IS NULL;
