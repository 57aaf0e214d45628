"""The node agent, `oz0-node`."""
