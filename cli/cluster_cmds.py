"""`orchestrator-zero cluster ...`"""

from __future__ import annotations

from cyclopts import App

from cli.client import ApiClient
from cli.output import print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0.context import select

app = App(name="cluster", help_format="markdown")  # help: cli/main.py


@app.command
def info(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """The cluster's name, CA hash and the servers that are up."""
    data = ApiClient(select(context)).get("/api/v1/cluster")
    if json:
        print_json(data)
        return 0
    print(f"cluster: {data['name']}")
    print(f"CA hash: {data['ca_hash']}")
    print(f"servers up: {len(data['servers'])}")
    print_table(
        ["ID", "ADVERTISE", "TEMPORAL", "STARTED", "LAST HEARTBEAT"],
        [
            [s["id"], s["advertise"], s["temporal"], s["started_at"], s["last_heartbeat"]]
            for s in data["servers"]
        ],
    )
    return 0
