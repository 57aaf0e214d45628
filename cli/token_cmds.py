"""`orchestrator-zero token ...`"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Annotated, Any

from cyclopts import App, Parameter

from cli.client import ApiClient
from cli.completers import TenantName, TokenId
from cli.output import print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0.context import select
from oz0.errors import Oz0Error
from oz0.token_rules import DEFAULT_MAX_USES, DEFAULT_TTL, TOKEN_ID, parse_label_pairs

app = App(name="token", help_format="markdown")  # help: cli/main.py

LabelArgs = Annotated[
    list[str] | None,
    Parameter(
        name="--label",
        negative=(),
        help="KEY=VALUE given to every node joining with the token; repeat for several.",
    ),
]


@app.command
def create(
    *,
    tenant: TenantName,
    ttl: str = DEFAULT_TTL,
    max_uses: int = DEFAULT_MAX_USES,
    label: LabelArgs = None,
    description: str = "",
    lock_labels: Annotated[bool, Parameter(negative=())] = False,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Create a join token; it is shown only this once.

    Parameters
    ----------
    tenant
        The tenant nodes joining with the token belong to.
    ttl
        How long the token can be used, such as 24h, 30m, 7d or 1h30m; 0 for ever.
    max_uses
        How many nodes can join with it; 0 for any number.
    description
        What the token is for.
    lock_labels
        The token's labels are all a node joining with it gets: a label the node claims
        beyond them refuses its join.
    """
    ctx = select(context)
    body: dict[str, Any] = {
        "tenant": tenant,
        "ttl": ttl,
        "max_uses": max_uses,
        "labels": parse_label_pairs(label or []),
        "description": description,
    }
    if lock_labels:  # sent only when asked: a server of an earlier release knows no such field
        body["lock_labels"] = True
    token = ApiClient(ctx).post("/api/v1/tokens", body)
    if lock_labels and token.get("lock_labels") is not True:
        raise Oz0Error(
            f"the server is of an earlier release and made token {token['id']} without"
            f" --lock-labels: revoke it (token revoke {token['id']}) and make it again once"
            " every server is upgraded"
        )
    if json:
        print_json(token)
        return 0
    limit = token["max_uses"]
    uses = "any number of uses" if limit == 0 else f"up to {limit} use{'' if limit == 1 else 's'}"
    expires = (
        "never expires" if token["expires_at"] is None else f"expires {_time(token['expires_at'])}"
    )
    locked = ", labels locked" if token.get("lock_labels") else ""
    print(f"token {token['id']} created for tenant {token['tenant']}: {uses}, {expires}{locked}")
    print()
    print(f"    {token['token']}")
    print()
    print("This is the only time the token is shown: the cluster keeps only its hash.")
    if token["agent_sha256"] is None:
        print("A node joins with it, accepted at once, running an installed oz0-node (the")
        print("servers have no agent file to serve; see docs/manage-nodes.md):")
    else:
        print("A node joins with it, accepted at once: paste this on the node (it needs curl")
        print("and python3 >= 3.11; it downloads the agent into a private temporary directory,")
        print("checks its SHA-256 and keeps the token out of the agent's arguments):")
    print()
    print(token["join_command"])
    return 0


@app.command(name="list")
def list_(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Every join token, revoked ones too; never their secrets."""
    tokens = ApiClient(select(context)).get("/api/v1/tokens")["tokens"]
    if json:
        print_json(tokens)
        return 0
    print_table(
        ["ID", "TENANT", "USES", "MAX USES", "EXPIRES", "LABELS", "DESCRIPTION", "REVOKED"],
        [
            [
                t["id"],
                t["tenant"],
                t["uses"],
                "unlimited" if t["max_uses"] == 0 else t["max_uses"],
                "never" if t["expires_at"] is None else _time(t["expires_at"]),
                ",".join(f"{k}={v}" for k, v in sorted(t["labels"].items()))
                + (" (locked)" if t.get("lock_labels") else ""),
                t["description"],
                "yes" if t["revoked"] else "no",
            ]
            for t in tokens
        ],
    )
    return 0


@app.command
def revoke(token_id: TokenId, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Stop new joins with a token; nodes that already joined with it stay.

    Parameters
    ----------
    token_id
        The token's ID, such as tok-0123456789ab.
    """
    if not TOKEN_ID.fullmatch(token_id):
        raise Oz0Error(
            f"invalid token id {token_id!r}: an id looks like tok-0123456789ab "
            "(a token's part before the '.')"
        )
    path = f"/api/v1/tokens/{urllib.parse.quote(token_id, safe='')}/revoke"
    token = ApiClient(select(context)).post(path, {})
    if json:
        print_json(token)
    else:
        print(f"token {token['id']} revoked; nodes that joined with it stay")
    return 0


def _time(iso: str) -> str:
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
