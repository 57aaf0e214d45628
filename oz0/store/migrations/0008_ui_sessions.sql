-- The web UI's sign-ins (oz0/web/). A session is a row, so any server honours it and a
-- sign-out ends it on every server; the browser holds only a random token, kept here as
-- its SHA-256. Failed sign-ins are rows too, so their rate limit holds across servers.
CREATE TABLE ui_sessions (
    token_sha256 text PRIMARY KEY,
    username text NOT NULL REFERENCES ui_accounts (username) ON DELETE CASCADE,
    csrf text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    source text NOT NULL
);
CREATE INDEX ui_sessions_username ON ui_sessions (username);

CREATE TABLE ui_sign_in_failures (
    id bigserial PRIMARY KEY,
    username text NOT NULL,
    source text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ui_sign_in_failures_username ON ui_sign_in_failures (username, at);
CREATE INDEX ui_sign_in_failures_source ON ui_sign_in_failures (source, at);

-- What is done in the web UI is audited with the actor `ui:<account>`.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_actor_kind_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_actor_kind_check
    CHECK (actor_kind IN ('operator', 'node', 'server', 'ui'));
