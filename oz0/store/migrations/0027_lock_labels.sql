-- oz0: expand
-- Node labels that a token does not set, restricted (issue 42, oz0/node_labels.py).
-- Expand only: a server of the previous release beside this one knows neither column and
-- would let a node joining through its edge claim labels as before, so neither can be
-- turned on while such a server is up (node_labels.check_upgraded).
--
-- join_tokens.lock_labels: the token's labels are all a node joining with it gets; a label
--   the node claims beyond them refuses the join (`token create --lock-labels`).
-- cluster_settings.lock_node_labels: the same for every token (`cluster set
--   --lock-node-labels`).
ALTER TABLE join_tokens ADD COLUMN lock_labels boolean NOT NULL DEFAULT false;
ALTER TABLE cluster_settings ADD COLUMN lock_node_labels boolean NOT NULL DEFAULT false;
