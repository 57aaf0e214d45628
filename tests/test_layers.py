"""Layers run one way: a module imports only its own layer and the layers below it.

The table is the rule docs/architecture.md explains; this test reads every import of the
product's source (lazy ones and those only for type checkers too) without running it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fixtures.syntax_trees import parsed

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A module belongs to the layer of the longest prefix naming it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # What servers and the agent share; imports nothing of ours.
    ("common", ("oz0_common",)),
    # Pure values and rules: errors, the CLI's context file, keys and certificates, names.
    (
        "core",
        (
            "oz0",
            "oz0.errors",
            "oz0.context",
            "oz0.passwords",
            "oz0.pki",
            "oz0.listing",
            "oz0.purge_command",
            # What the command line checks and shows without loading the server.
            "oz0.node_rules",
            "oz0.token_rules",
            "oz0.label_rules",
            "oz0.retention_rules",
            "oz0.cap_rules",
            "oz0.server_defaults",
        ),
    ),
    # PostgreSQL: the pool, migrations, LISTEN and the hub that fans its news out.
    ("store", ("oz0.store",)),
    # The cluster's records and their rules, each a module of SQL over a connection.
    (
        "domain",
        (
            "oz0.access",
            "oz0.audit",
            "oz0.audit_stream",
            "oz0.cluster",
            "oz0.enrollment",
            "oz0.membership",
            "oz0.nodes",
            "oz0.node_labels",
            "oz0.node_strings",
            "oz0.joins",
            "oz0.operators",
            "oz0.tenants",
            "oz0.tenant_caps",
            "oz0.file_blobs",
            "oz0.file_blob_cache",
            "oz0.tokens",
            "oz0.ui_accounts",
            "oz0.ui_sessions",
            "oz0.node_sessions",
        ),
    ),
    # The embedded Temporal server: its host process, namespaces, who may reach it.
    ("temporal", ("oz0.temporal",)),
    # Jobs: their records, workflow, activities and the worker running them.
    ("jobs", ("oz0.jobs",)),
    # The server process and what only a server machine runs: its roles (API, web UI,
    # edge), the agent file it serves, and `server init` / `server operator issue`.
    (
        "server",
        (
            "oz0.server",
            "oz0.web",
            "oz0.agent_file",
            "oz0.cluster_init",
            "oz0.operator_issue",
            "oz0.devmode",
            # What a person's leaving ends: people (domain) and their schedules (jobs).
            "oz0.leaving",
        ),
    ),
    # The `orchestrator-zero` command (tests/test_cli_imports.py: what each command loads).
    ("cli", ("cli",)),
]
RANK = {prefix: rank for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}
NAMES = [name for name, _ in LAYERS]
# The agent is its own world (tests/test_agent_standalone.py): it may use only oz0_common.
AGENT = "oz0_node"
SOURCES = ("oz0", "oz0_common", "oz0_node", "cli")


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        rank = RANK.get(".".join(parts[:end]))
        if rank is not None:
            return rank
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """Every module this file imports, with its line: `from a import b` counts as `a.b`
    (b may be a submodule), relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
    return found


def ours(name: str) -> bool:
    return name.split(".")[0] in SOURCES


def violations() -> list[str]:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "bin" in path.relative_to(ROOT).parts:
                continue
            module = module_name(path)
            where = f"{path.relative_to(ROOT)}"
            mine = layer_of(module)
            for line, target in imports_of(path, module):
                if not ours(target):
                    continue
                if module.split(".")[0] == AGENT or target.split(".")[0] == AGENT:
                    # The agent and its build are checked below and by their own test.
                    continue
                theirs = layer_of(target)
                if mine is None or theirs is None:
                    found.append(f"{where}:{line}: {module} or {target} is in no layer")
                elif theirs > mine:
                    found.append(
                        f"{where}:{line}: {module} ({NAMES[mine]}) imports {target} "
                        f"({NAMES[theirs]}), a layer above it"
                    )
    return found


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    assert violations() == []


def test_the_agent_imports_only_what_it_shares_with_servers() -> None:
    found = []
    for path in sorted((ROOT / AGENT).rglob("*.py")):
        module = module_name(path)
        for line, target in imports_of(path, module):
            if ours(target) and target.split(".")[0] not in (AGENT, "oz0_common"):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert found == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    # The check itself: a store module reaching up into the server is reported.
    upward = tmp_path / "upward.py"
    upward.write_text("from oz0.server import start\nfrom oz0.errors import Oz0Error\n")
    rank = layer_of("oz0.store.pool")
    assert rank is not None
    targets = [t for _, t in imports_of(upward, "oz0.store.upward")]
    assert [t for t in targets if (layer_of(t) or 0) > rank] == ["oz0.server.start"]


def test_the_architecture_page_lists_the_layers_of_this_table() -> None:
    """docs/architecture.md's table of layers says what LAYERS says: the same layers, in
    order, each with the same modules (backticked in its last column)."""
    rows = [
        line.split("|")[1:-1]
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("| ") and line.count("|") == 4
    ]
    documented = [
        (cells[0].strip(), set(re.findall(r"`([A-Za-z0-9_.]+)`", cells[2])))
        for cells in rows
        if cells[0].strip() in NAMES
    ]
    assert documented == [(name, set(prefixes)) for name, prefixes in LAYERS]
