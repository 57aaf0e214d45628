"""`orchestrator-zero tenant ...`"""

from __future__ import annotations

from cyclopts import App

from cli.client import ApiClient
from cli.output import print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0.context import select

app = App(name="tenant", help_format="markdown")  # help: cli/main.py


@app.command
def create(name: str, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Create tenant NAME and its Temporal namespace.

    Refused when NAME is one of Temporal's own namespaces (it starts with 'temporal-') or
    Temporal already has a namespace NAME that orchestrator-zero did not create.

    Parameters
    ----------
    name
        Lowercase letters, digits and '-', not starting with 'temporal-'.
    """
    tenant = ApiClient(select(context)).post("/api/v1/tenants", {"name": name})
    if json:
        print_json(tenant)
    else:
        print(f"tenant {tenant['name']} created (namespace {tenant['namespace']})")
    return 0


@app.command(name="list")
def list_(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Every tenant."""
    tenants = ApiClient(select(context)).get("/api/v1/tenants")["tenants"]
    if json:
        print_json(tenants)
        return 0
    print_table(
        ["NAME", "NAMESPACE", "CREATED"],
        [[t["name"], t["namespace"], t["created_at"]] for t in tenants],
    )
    return 0
