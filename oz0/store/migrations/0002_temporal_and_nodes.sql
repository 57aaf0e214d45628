-- Each server reports the state of its Temporal host: starting, serving or restarting.
ALTER TABLE servers ADD COLUMN temporal_state text NOT NULL DEFAULT 'starting';

-- Nodes, as far as Temporal's authorization needs them; the nodes issue adds the rest.
-- Every insert and update takes a fresh revision and notifies `oz0_nodes` in the same
-- transaction, whoever writes: servers act on the notification, and a reconcile loop
-- reading revisions catches any notification that was lost.
CREATE SEQUENCE node_revision;

CREATE TABLE nodes (
    id text PRIMARY KEY CHECK (id ~ '^node-[0-9a-f]{12}$'),
    tenant text NOT NULL REFERENCES tenants (name),
    state text NOT NULL CHECK (state IN ('pending', 'accepted', 'rejected', 'blocked', 'purging')),
    revision bigint NOT NULL DEFAULT nextval('node_revision'),
    joined_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX nodes_revision ON nodes (revision);

CREATE FUNCTION nodes_bump_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.revision := nextval('node_revision');
    RETURN NEW;
END $$;

CREATE FUNCTION nodes_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oz0_nodes', coalesce(NEW.id, OLD.id));
    RETURN NULL;
END $$;

CREATE TRIGGER nodes_revision BEFORE UPDATE ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_bump_revision();
CREATE TRIGGER nodes_notify AFTER INSERT OR UPDATE OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_notify();
