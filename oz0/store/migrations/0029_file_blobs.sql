-- oz0: expand
-- Files pushed to nodes (issue 43, oz0/file_blobs.py): each content stored once per
-- cluster by its SHA-256, in chunks of CHUNK bytes so that any server's edge can serve
-- it; a tenant's reference to a blob (the name it was pushed as) is what its caps count
-- and what keeps the blob. Expand only: a server of the previous release beside this one
-- knows none of these tables, and refuses a push job's command as any job's it cannot run
-- (its nodes' agents run it as the command it names, which does not exist).
CREATE TABLE file_blobs (
    sha256 text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size bigint NOT NULL CHECK (size >= 0),
    -- True once every chunk is in and their SHA-256 checked: only then is it pushed.
    complete boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE file_chunks (
    sha256 text NOT NULL REFERENCES file_blobs (sha256) ON DELETE CASCADE,
    seq integer NOT NULL CHECK (seq >= 0),
    data bytea NOT NULL,
    PRIMARY KEY (sha256, seq)
);

CREATE TABLE tenant_files (
    tenant text NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    sha256 text NOT NULL REFERENCES file_blobs (sha256) ON DELETE CASCADE,
    name text NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Pushed (or registered) last: kept while its tenant keeps jobs that old.
    used_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, sha256)
);
CREATE INDEX tenant_files_by_blob ON tenant_files (sha256);

-- A tenant's caps (`tenant create/set`, oz0/cap_rules.py): one file's size, and all its
-- files' together.
ALTER TABLE tenants
    ADD COLUMN max_file_bytes bigint NOT NULL DEFAULT 67108864 CHECK (max_file_bytes > 0),
    ADD COLUMN max_files_bytes bigint NOT NULL DEFAULT 4294967296 CHECK (max_files_bytes > 0);

-- `job run --file SRC[:NAME]`: the files placed in each attempt's working directory before
-- its command starts, [{"sha256", "size", "name"}], which its grant signs.
ALTER TABLE jobs ADD COLUMN files jsonb NOT NULL DEFAULT '[]'::jsonb;

-- What the pruner asks of each blob: does a job still name it (oz0/file_blobs.py)?
CREATE INDEX jobs_pushed_blob ON jobs ((command ->> 1)) WHERE command ->> 0 = '@oz0/file-push';
CREATE INDEX jobs_placed_files ON jobs USING gin (files jsonb_path_ops)
    WHERE files <> '[]'::jsonb;
