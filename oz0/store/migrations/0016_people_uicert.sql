-- The web UI's CA (issue 28): the one browsers are asked to trust, limited by critical name
-- constraints to the cluster's names, its key sealed with the master key as the other CAs'
-- are. Made by the first `server start` that finds none (oz0/cluster.py, ensure_ui_ca).
ALTER TABLE cluster
    ADD COLUMN ui_ca_cert text,
    ADD COLUMN ui_ca_key_sealed bytea,
    ADD CONSTRAINT cluster_ui_ca_whole CHECK ((ui_ca_cert IS NULL) = (ui_ca_key_sealed IS NULL));
