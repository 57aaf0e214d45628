"""The command line starts in a blink: `orchestrator-zero --help` and every client command
load nothing of the server. Only the `server ...` commands import it, inside themselves, so
`server --help` stays light too. (The time itself is a benchmark row, not a test:
bench/cli_start.py.)

Each probe runs in a fresh interpreter and prints the modules it ended up with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cli

# What only the servers use: their packages, requirements/server.txt and what it brings
# (every domain module that touches the database imports psycopg); and what the client has
# no use for although the agent does: Temporal, and Trio (the client has no event loop).
# Each weighs tens of milliseconds or more at import.
SERVER_ONLY = (
    "oz0.server", "oz0.web", "oz0.temporal", "oz0.store",
    "hypercorn", "quart", "quart_trio", "flask", "werkzeug", "jinja2", "wsproto",
    "psycopg", "psycopg_pool", "psycopg_binary", "pgserver", "prometheus_client",
    "temporalio", "trio", "trio_websocket",
)  # fmt: skip

# The one client module with an event loop: an interactive session's two directions at
# once (`node shell`, `node exec`), imported inside those commands only.
SESSION_CLIENT = "cli.session_client"
# Every module of the command line but the server's own group and the session client.
CLIENT_MODULES = sorted(
    f"cli.{path.stem}"
    for path in Path(cli.__file__).parent.glob("*.py")
    if path.stem not in ("__init__", "server_cmds") and f"cli.{path.stem}" != SESSION_CLIENT
)
# What the session client may load of SERVER_ONLY: Trio and its websocket client.
SESSION_LOOP = ("trio", "trio_websocket", "wsproto")


def _loaded(probe: str, *, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running PROBE."""
    code = probe + "\nimport sys\nprint('LOADED', ' '.join(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    last = done.stdout.splitlines()[-1]
    assert last.startswith("LOADED "), done.stdout
    return set(last.split()[1:])


def _server_modules(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in SERVER_ONLY))


def test_the_cli_and_every_client_command_module_load_nothing_of_the_server() -> None:
    assert "cli.node_cmds" in CLIENT_MODULES and "cli.client" in CLIENT_MODULES
    imports = "".join(f"import {name}\n" for name in ["cli.main", *CLIENT_MODULES])
    loaded = _loaded(imports)
    assert {"cli.main", "cli.node_cmds", "cli.job_cmds", "oz0.jobs.spec_text"} <= loaded
    assert _server_modules(loaded) == []


def test_help_loads_nothing_of_the_server_nor_any_command_group() -> None:
    loaded = _loaded(
        "import contextlib, io\n"
        "from cli.main import run\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert run(['--help']) == 0\n"
        "assert 'Run a fleet of nodes' in out.getvalue()\n"
    )
    assert _server_modules(loaded) == []
    # Each group is imported only when a command line names it.
    assert [m for m in loaded if m.startswith("cli.") and m.endswith("_cmds")] == []


def test_the_server_group_loads_the_server_only_inside_its_commands() -> None:
    loaded = _loaded(
        "import contextlib, io\n"
        "from cli.main import run\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    for command in (['server'], ['server', 'start'], ['server', 'operator', 'issue']):\n"
        "        assert run([*command, '--help']) == 0\n"
        "assert '--max-pending-nodes' in out.getvalue()\n"
    )
    assert "cli.server_cmds" in loaded
    assert _server_modules(loaded) == []


def test_a_client_command_that_runs_loads_nothing_of_the_server(tmp_path: Path) -> None:
    # `node list` up to reading its context, which is missing: the group is imported and
    # its command called.
    env = {**os.environ, "OZ0_CONTEXT": str(tmp_path / "missing" / "context.json")}
    loaded = _loaded(
        "import contextlib, io\n"
        "from cli.main import run\n"
        "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "    assert run(['node', 'list']) == 1\n"
        "assert 'context' in err.getvalue(), err.getvalue()\n",
        env=env,
    )
    assert "cli.node_cmds" in loaded
    assert _server_modules(loaded) == []


def test_the_session_client_loads_trio_and_nothing_else_of_the_server() -> None:
    loaded = _loaded(f"import {SESSION_CLIENT}")
    assert {"trio", "trio_websocket"} <= loaded
    extra = [
        m for m in _server_modules(loaded)
        if not any(m == p or m.startswith(p + ".") for p in SESSION_LOOP)
    ]  # fmt: skip
    assert extra == []
