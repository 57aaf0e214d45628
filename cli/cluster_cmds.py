"""`orchestrator-zero cluster ...`"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from cyclopts import App, Parameter, Token

from cli.client import ApiClient
from cli.job_params import duration
from cli.output import print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0 import retention_rules as rules
from oz0.context import select
from oz0.errors import Oz0Error

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
    print(f"audit log kept: {_kept(data['audit_retention'])}")
    print(f"node labels: {_labels(data.get('lock_node_labels'))}")
    print(f"sessions: {_sessions(data)}")
    print(f"servers up: {len(data['servers'])}")
    print_table(
        ["ID", "ADVERTISE", "TEMPORAL", "STARTED", "LAST HEARTBEAT"],
        [
            [s["id"], s["advertise"], s["temporal"], s["started_at"], s["last_heartbeat"]]
            for s in data["servers"]
        ],
    )
    return 0


def _kept(retention: str) -> str:
    return "for ever" if retention == rules.KEEP else retention


def _labels(locked: bool | None) -> str:
    if locked is None:  # a server of an earlier release
        return "unknown"
    return "their join token's only (locked)" if locked else "their join token's and their own"


def _sessions(data: dict[str, Any]) -> str:
    if "session_idle_timeout_seconds" not in data:  # a server of an earlier release
        return "unknown"
    typed = "recorded" if data["session_record_input"] else "not recorded"
    return (
        f"idle timeout {data['session_idle_timeout_seconds']} s, at most"
        f" {data['session_max_seconds']} s, input {typed}"
    )


def _audit_retention(type_: Any, tokens: Sequence[Token]) -> str:
    """cyclopts converter for `--audit-retention`: checked here (one line, exit 2, nothing
    sent), sent as typed."""
    try:
        rules.audit_retention(tokens[0].value)
    except rules.RetentionError as e:
        raise ValueError(str(e)) from None
    return tokens[0].value


@app.command(name="set")
def set_(
    *,
    audit_retention: Annotated[
        str | None, Parameter(converter=_audit_retention, metavar="DURATION|keep", negative=())
    ] = None,
    lock_node_labels: bool | None = None,
    session_record_input: bool | None = None,
    session_idle_timeout: Annotated[
        float | None, Parameter(converter=duration, metavar="DURATION", negative=())
    ] = None,
    session_max_length: Annotated[
        float | None, Parameter(converter=duration, metavar="DURATION", negative=())
    ] = None,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Change the cluster's settings; the change is in the audit log (who, from what to what).

    Parameters
    ----------
    audit_retention
        How long the audit log keeps a row: 1d to 3650d, such as 400d, or `keep` (for
        ever, the default). Older rows are deleted within minutes.
    lock_node_labels
        A node joining with a token gets the token's labels only, whatever token: a label
        it claims beyond them refuses its join. `--no-lock-node-labels` (the default): a
        node adds its own labels for the keys its token does not set.
    session_record_input
        Record what people type in sessions too (`node shell`, `node exec`), not only
        what the node shows (the default: `--no-session-record-input`; a typed password
        would be kept).
    session_idle_timeout
        End a session after this long without input or output (default 15m).
    session_max_length
        End a session once it has lasted this long (default 8h).
    """
    body: dict[str, Any] = {}
    if audit_retention is not None:
        body["audit_retention"] = audit_retention
    if lock_node_labels is not None:
        body["lock_node_labels"] = lock_node_labels
    if session_record_input is not None:
        body["session_record_input"] = session_record_input
    for name, value in (
        ("session_idle_timeout_seconds", session_idle_timeout),
        ("session_max_seconds", session_max_length),
    ):
        if value is not None:
            body[name] = max(1, round(value))
    if not body:
        raise Oz0Error(
            "nothing to change: give --audit-retention, --[no-]lock-node-labels,"
            " --[no-]session-record-input, --session-idle-timeout or --session-max-length"
        )
    data = ApiClient(select(context)).request("PATCH", "/api/v1/cluster", body)
    if json:
        print_json(data)
    else:
        print(f"audit log kept: {_kept(data['audit_retention'])}")
        print(f"node labels: {_labels(data.get('lock_node_labels'))}")
        print(f"sessions: {_sessions(data)}")
    return 0
