"""`orchestrator-zero node ...`: see the fleet, approve joins, shut nodes out, remove them."""

from __future__ import annotations

from typing import Annotated, Any

from cyclopts import App, Parameter

from cli.client import ApiClient
from cli.completers import NodeId, TenantOption
from cli.output import print_fields, print_json
from cli.paging import PAGE_SIZE, LimitOption, PageSizeOption, check, pages, print_pages
from cli.params import ContextPath, JsonFlag
from oz0 import node_rules, token_rules
from oz0.context import select
from oz0.errors import Oz0Error

app = App(name="node", help_format="markdown")  # help: cli/main.py

SelectorArgs = Annotated[list[str] | None, Parameter(name="--selector", negative=())]


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _connection(node: dict[str, Any]) -> str:
    return f"yes ({node['server']})" if node["connected"] else "no"


@app.command(name="list")
def list_(
    *,
    state: str | None = None,
    tenant: TenantOption = None,
    label: str | None = None,
    search: str | None = None,
    limit: LimitOption = None,
    page_size: PageSizeOption = PAGE_SIZE,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Every node, oldest first, or those matching every filter given. Pages are
    fetched one after another and printed as they come.

    Parameters
    ----------
    state
        pending, accepted, rejected, blocked or purging.
    tenant
        Only nodes of this tenant.
    label
        KEY=VALUE: nodes with that label; KEY: nodes with any value for KEY.
    search
        Nodes whose ID or host name holds this text (any case, taken literally).
    """
    check(limit, page_size)
    query = {"state": state, "tenant": tenant, "label": label, "search": search}
    found = pages(
        ApiClient(select(context)), "/api/v1/nodes", query, "nodes", limit=limit,
        page_size=page_size,
    )  # fmt: skip
    print_pages(
        found,
        json_output=json,
        headers=["ID", "STATE", "TENANT", "CONNECTED", "LAST SEEN", "HOSTNAME", "LABELS"],
        cells=lambda n: [
            n["id"], n["state"], n["tenant"], _connection(n), n["last_seen"] or "never",
            n["hostname"], _labels(n["labels"]),
        ],
    )  # fmt: skip
    return 0


@app.command
def show(node_id: NodeId, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """One node in detail."""
    node = ApiClient(select(context)).get(f"/api/v1/nodes/{node_id}")
    if json:
        print_json(node)
        return 0
    fields = [
        ("id", node["id"]),
        ("state", node["state"]),
        ("tenant", node["tenant"]),
        ("hostname", node["hostname"]),
        ("labels", _labels(node["labels"]) or "-"),
        ("connected", _connection(node)),
        ("last seen", node["last_seen"] or "never"),
        ("joined", node["joined_at"]),
        ("token", node["token_id"] or "- (approved by an operator)"),
        ("reason", node["reason"] or "-"),
    ]
    print_fields(fields)
    return 0


@app.command
def accept(node_id: NodeId, /, *, context: ContextPath = None) -> int:
    """Let a pending node in; it picks its certificate up at once."""
    node = ApiClient(select(context)).post(f"/api/v1/nodes/{node_id}/accept", {})
    print(f"node {node['id']} accepted (tenant {node['tenant']})")
    return 0


@app.command
def reject(node_id: NodeId, /, *, reason: str | None = None, context: ContextPath = None) -> int:
    """Refuse a pending node; its agent stops with the reason.

    Parameters
    ----------
    reason
        Told to the node and kept on it.
    """
    node = ApiClient(select(context)).post(f"/api/v1/nodes/{node_id}/reject", {"reason": reason})
    print(f"node {node['id']} rejected")
    return 0


def _selection(
    node_ids: tuple[str, ...], selector: list[str] | None, tenant: str | None
) -> dict[str, Any]:
    """The body naming the nodes: IDs, or labels every node must have (and a tenant)."""
    if node_ids and selector:
        raise Oz0Error("give node IDs or --selector, not both")
    if node_ids:
        if tenant is not None:
            raise Oz0Error("--tenant goes with --selector, not with node IDs")
        # Refused here rather than as a body too big for the API.
        node_rules.check_id_count(len(set(node_ids)))
        return {"ids": list(node_ids)}
    if not selector:
        raise Oz0Error("name the nodes: one or more node IDs, or --selector KEY=VALUE")
    labels = token_rules.check_labels(token_rules.parse_label_pairs(selector))
    return {"selector": labels, "tenant": tenant}


def _report(changed: list[dict[str, Any]], done: str, json: bool) -> None:
    if json:
        print_json(changed)
    elif len(changed) == 1:
        node = changed[0]
        print(f"node {node['id']} {done}" + (f" ({node['state']})" if done == "unblocked" else ""))
    else:
        print(f"{len(changed)} nodes {done}: " + " ".join(n["id"] for n in changed))


@app.command
def block(
    *node_ids: NodeId,
    reason: str,
    selector: SelectorArgs = None,
    tenant: TenantOption = None,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Shut nodes out on every server within two seconds; they keep their files.

    All the nodes named, or matched, are blocked in one transaction, or none is: an unknown
    ID, or a node that is neither pending nor accepted, changes nothing.

    Parameters
    ----------
    node_ids
        The nodes to block (at most 2,000).
    reason
        Why; kept in the audit log (not told to the node).
    selector
        KEY=VALUE: instead of IDs, every pending or accepted node with this label (repeat
        for several labels, all required; at most 10,000 nodes).
    tenant
        With --selector: only nodes of this tenant.
    """
    body = {**_selection(node_ids, selector, tenant), "reason": reason}
    changed = ApiClient(select(context)).post("/api/v1/nodes/block", body)["nodes"]
    _report(changed, "blocked", json)
    return 0


@app.command
def unblock(
    *node_ids: NodeId,
    selector: SelectorArgs = None,
    tenant: TenantOption = None,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Let blocked nodes back in; each notices by itself within ten seconds.

    All in one transaction, or none (an unknown ID, or a node that is not blocked).

    Parameters
    ----------
    node_ids
        The nodes to unblock (at most 2,000).
    selector
        KEY=VALUE: instead of IDs, every blocked node with this label (repeat for several).
    tenant
        With --selector: only nodes of this tenant.
    """
    body = _selection(node_ids, selector, tenant)
    changed = ApiClient(select(context)).post("/api/v1/nodes/unblock", body)["nodes"]
    _report(changed, "unblocked", json)
    return 0


@app.command
def delete(node_id: NodeId, /, *, context: ContextPath = None) -> int:
    """Forget a node. Its files stay on its machine; its key may join again as a new node."""
    node = ApiClient(select(context)).request("DELETE", f"/api/v1/nodes/{node_id}")
    print(f"node {node['id']} deleted")
    return 0


@app.command
def purge(
    node_id: NodeId,
    /,
    *,
    yes: Annotated[bool, Parameter(negative=())] = False,
    context: ContextPath = None,
) -> int:
    """Make a node remove itself from its machine. It cannot be undone.

    The node is shut out at once; on its next control stream it checks a command signed
    by the cluster CA, then deletes its data directory and its launcher.

    Parameters
    ----------
    yes
        Confirm: purging cannot be undone.
    """
    if not yes:
        raise Oz0Error(
            f"purging node {node_id} deletes its data from its machine and cannot be undone;"
            " add --yes to go ahead"
        )
    node = ApiClient(select(context)).post(f"/api/v1/nodes/{node_id}/purge", {})
    print(f"node {node['id']} purging: it removes itself on its next control stream")
    return 0


# `node shell`: the node's bash as a login shell if it has one, else its sh.
SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null; then exec bash -l; fi; exec sh -l"]


@app.command(name="exec")
def exec_(
    node_id: NodeId,
    /,
    *command: str,
    interactive: Annotated[bool, Parameter(name=["--interactive", "-i"], negative=())] = False,
    tty: Annotated[bool, Parameter(name=["--tty", "-t"], negative=())] = False,
    user: str | None = None,
    context: ContextPath = None,
) -> int:
    """Run a command on a node (put it after --); its exit code.

    It runs isolated as a job does (its own UID where the node gives them), recorded and
    audited (docs/sessions.md). Operators and admins of the node's tenant only.

    Parameters
    ----------
    command
        The command and its arguments, after --; run as is, without a shell.
    interactive
        Send this command's stdin to it (without -t: its stdin ends where this one does).
    tty
        Give it a terminal (a PTY) and put this one in raw mode meanwhile: every key
        (Ctrl-C too) goes to the node. Without: its stdout comes to stdout, its stderr
        to stderr.
    user
        Run it as this account of the node: admins of its tenant only, and only where the
        node allows it (oz0-node --session-users).
    """
    if not command:
        raise Oz0Error(
            "node exec needs the command after --, such as: orchestrator-zero node exec NODE"
            " -- uptime"
        )
    from cli.session_client import check_user, run_session

    check_user(user)
    return run_session(
        select(context), node_id, list(command), interactive=interactive, terminal=tty, user=user
    )


@app.command
def shell(node_id: NodeId, /, *, user: str | None = None, context: ContextPath = None) -> int:
    """An interactive shell on a node (as `node exec -i -t NODE -- bash -l`); its exit code.

    Parameters
    ----------
    user
        As this account of the node: admins of its tenant only, and only where the node
        allows it (oz0-node --session-users).
    """
    from cli.session_client import check_user, run_session

    check_user(user)
    return run_session(select(context), node_id, SHELL, interactive=True, terminal=True, user=user)
