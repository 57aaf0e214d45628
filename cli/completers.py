"""Live completions: node, job, token, schedule and tenant IDs, asked of the cluster when
TAB is pressed (docs/run-a-cluster.md, "Shell completion").

The script `orchestrator-zero --install-completion` puts in the shell (cyclopts makes it)
completes commands and flags itself; for an argument given a completer here it runs
`orchestrator-zero __complete WORDS...`, and cyclopts calls the completer. A shell waits
for it, so the request has DEADLINE in all, whatever the number of servers the context
names and however they fail; past it, or on any failure (no context, a server down, an
expired certificate, a refusal), there is no candidate and nothing is printed.

Each completer imports the API client only when called: the commands that name them load
this module, and nothing of it may weigh on their start (tests/test_cli_imports.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import Parameter

if TYPE_CHECKING:
    from cyclopts.completion import CompletionContext

# For the whole request, connection and TLS included: a TAB that answers later is broken.
DEADLINE = 1.5
# Candidates asked for: more than a shell shows usefully; the typed prefix narrows nodes.
LIMIT = 200

Candidates = list[tuple[str, str]]


def _ask(context: CompletionContext, path: str, query: dict[str, Any] | None = None) -> Any:
    """GET PATH as the context's operator, the request within DEADLINE; None on any failure."""
    from cli.client import ApiClient
    from oz0.context import select

    typed = context.get("context")
    explicit = typed.raw if typed is not None else None
    try:
        # Nothing learned is written back: a completion changes no file.
        client = ApiClient(select(Path(explicit) if explicit else None), learn_servers=False)
    except Exception:
        return None
    answers: list[Any] = []

    def fetch() -> None:
        try:
            answers.append(client.get(path, query))
        except Exception:
            return

    # Only the network in a thread (imports done above: none is left half-done at exit). A
    # daemon thread: one still waiting at the deadline is left to the process's exit,
    # which follows at once.
    worker = threading.Thread(target=fetch, name="oz0-completion", daemon=True)
    worker.start()
    worker.join(DEADLINE)
    return answers[0] if answers else None


def _rows(answer: Any, key: str) -> list[dict[str, Any]]:
    rows = answer.get(key) if isinstance(answer, dict) else None
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def _described(rows: list[dict[str, Any]], key: str, *parts: str) -> Candidates:
    """(ID, description) pairs; a description is what zsh and fish show beside an ID."""
    return [
        (str(row[key]), " ".join(str(row.get(p) or "") for p in parts).strip())
        for row in rows
        if isinstance(row.get(key), str)
    ]


def node_ids(context: CompletionContext) -> Candidates:
    # The API's search (an ID or host name holding the text) narrows a large fleet.
    query = {"limit": LIMIT, "search": context.incomplete or None}
    return _described(
        _rows(_ask(context, "/api/v1/nodes", query), "nodes"), "id", "hostname", "state"
    )


def job_ids(context: CompletionContext) -> Candidates:
    answer = _ask(context, "/api/v1/jobs", {"limit": LIMIT})
    return _described(_rows(answer, "jobs"), "id", "state", "tenant")


def token_ids(context: CompletionContext) -> Candidates:
    # Those that can still be revoked.
    tokens = [t for t in _rows(_ask(context, "/api/v1/tokens"), "tokens") if not t.get("revoked")]
    return _described(tokens, "id", "tenant", "description")


def schedule_ids(context: CompletionContext) -> Candidates:
    answer = _ask(context, "/api/v1/schedules")
    return _described(_rows(answer, "schedules"), "id", "tenant", "when")


def tenant_names(context: CompletionContext) -> Candidates:
    return _described(_rows(_ask(context, "/api/v1/tenants"), "tenants"), "name", "namespace")


def _completed(completer: Callable[[CompletionContext], Candidates]) -> Parameter:
    return Parameter(completer=completer)


# The arguments that name a cluster's objects, completed live.
NodeId = Annotated[str, _completed(node_ids)]
JobId = Annotated[str, _completed(job_ids)]
TokenId = Annotated[str, _completed(token_ids)]
ScheduleId = Annotated[str, _completed(schedule_ids)]
TenantName = Annotated[str, _completed(tenant_names)]
NodeOption = Annotated[str | None, _completed(node_ids)]
ScheduleOption = Annotated[str | None, _completed(schedule_ids)]
TenantOption = Annotated[str | None, _completed(tenant_names)]
