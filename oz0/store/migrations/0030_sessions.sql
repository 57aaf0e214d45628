-- oz0: expand
-- Interactive sessions on nodes (issue 43; docs/sessions.md, oz0/sessions.py). Expand only:
-- a server of the previous release beside this one opens no session and reads none of
-- this; the settings' defaults hold for it.
--
-- sessions: one row per session, written when it opens (its person, node, tenant and
--   command, its first window as asciicast v2's header) and when it ends (by the server
--   relaying it, or by any server once that one has stopped).
-- session_chunks: its recording as it happens, asciicast v2 event lines, each chunk sealed
--   with the master key bound to the session and the chunk's number (pki.Sealed.SESSION);
--   written before what it holds is shown to the person, so a server killed loses
--   nothing that was shown.
-- cluster_settings.session_*: whether a person's input is recorded too, how long a
--   session may sit idle, and how long it may last (`cluster set`).
CREATE TABLE sessions (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    node_id text NOT NULL,
    person text NOT NULL,
    command jsonb NOT NULL,
    header jsonb NOT NULL,
    server text NOT NULL,
    records_input boolean NOT NULL,
    -- The account it ran as (`--user`, docs/sessions.md); NULL: a UID of its own.
    run_as text,
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    exit_code integer,
    why text,
    input_bytes bigint NOT NULL DEFAULT 0,
    output_bytes bigint NOT NULL DEFAULT 0
);
CREATE INDEX sessions_by_start ON sessions (started_at DESC, id DESC);
CREATE INDEX sessions_by_node ON sessions (node_id, started_at DESC);
CREATE INDEX sessions_by_person ON sessions (person, started_at DESC);
-- The sessions not yet ended, by server: what each server's sweep looks at every few
-- seconds for those a server that stopped left open (oz0/server/session_sweeper.py).
CREATE INDEX sessions_open_by_server ON sessions (server) WHERE ended_at IS NULL;

CREATE TABLE session_chunks (
    session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq integer NOT NULL,
    sealed bytea NOT NULL,
    PRIMARY KEY (session_id, seq)
);

ALTER TABLE cluster_settings
    ADD COLUMN session_record_input boolean NOT NULL DEFAULT false,
    ADD COLUMN session_idle_timeout_s integer NOT NULL DEFAULT 900
        CHECK (session_idle_timeout_s > 0),
    ADD COLUMN session_max_s integer NOT NULL DEFAULT 28800 CHECK (session_max_s > 0);
