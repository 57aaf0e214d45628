"""The node agent stands alone: starting it imports nothing of the server (`oz0`), nor
what only servers use (PostgreSQL drivers, the web stack). What both sides need is in
`oz0_common`, which the agent carries."""

from __future__ import annotations

import subprocess
import sys

SERVER_ONLY = ("oz0", "cli", "psycopg", "psycopg_pool", "pgserver", "quart", "quart_trio",
               "hypercorn", "jinja2")  # fmt: skip


def test_the_agent_imports_nothing_of_the_server() -> None:
    # Every module of the agent, as its commands would load them.
    probe = (
        "import importlib, pkgutil, sys\n"
        "import oz0_node\n"
        "for info in pkgutil.walk_packages(oz0_node.__path__, 'oz0_node.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(done.stdout.split("\n")[-2].split())
    assert {"oz0_node", "oz0_common", "temporalio", "trio"} <= loaded
    assert loaded.isdisjoint(SERVER_ONLY), sorted(loaded & set(SERVER_ONLY))
