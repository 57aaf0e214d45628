"""What a route takes and answers, as types beside its handler: the OpenAPI document
(openapi.py) is made from these, and the tests hold the real answers to them.

A handler is marked under its route:

    @app.get("/api/v1/jobs/<job_id>")
    @described("A job", answers={200: JobJson})
    async def job_show(job_id: str) -> Response: ...

Types are TypedDicts (or lists of them): plain `typing`, so a client may import them too
without anything of the server's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ATTRIBUTE = "oz0_described"
JSON = "application/json"


class Error(TypedDict):
    """Every refusal and failure of the API: one line, the one the CLI prints."""

    error: str


@dataclass(frozen=True)
class Described:
    summary: str
    # The answers by HTTP status: a type for JSON, a media type's name for anything else
    # (`/metrics`, the agent file), None for no body (a WebSocket's upgrade). Errors
    # (Error) are added by openapi.py for every route.
    answers: Mapping[int, Any]
    # The JSON request body's type; None: the route reads no body.
    body: Any = None
    # A TypedDict of the query parameters (total=False: each is optional).
    query: Any = None
    # What each path parameter looks like (a JSON Schema), where it is more than text.
    path: Mapping[str, Mapping[str, Any]] | None = None
    # Statuses of errors particular to this route, with what they mean.
    errors: Mapping[int, str] | None = None
    # Longer words than the summary, where a route needs them.
    notes: str = ""


def described(
    summary: str,
    *,
    answers: Mapping[int, Any],
    body: Any = None,
    query: Any = None,
    path: Mapping[str, Mapping[str, Any]] | None = None,
    errors: Mapping[int, str] | None = None,
    notes: str = "",
    method: str | None = None,
) -> Callable[[F], F]:
    """Marks a handler with what its route takes and answers (Described): for METHOD only
    where one handler serves two methods that differ (a mark each), else for all."""
    what = Described(summary, answers, body, query, path, errors, notes)

    def mark(view: F) -> F:
        marks: dict[str | None, Described] = getattr(view, _ATTRIBUTE, {})
        setattr(view, _ATTRIBUTE, {**marks, method: what})
        return view

    return mark


def description_of(view: Callable[..., Any], method: str) -> Described | None:
    """VIEW's mark for METHOD (upper case), if it has one."""
    marks: dict[str | None, Described] = getattr(view, _ATTRIBUTE, {})
    return marks.get(method, marks.get(None))
