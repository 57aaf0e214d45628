"""The `orchestrator-zero` command."""
