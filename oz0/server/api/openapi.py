"""GET /api/v1/openapi.json: the API described (OpenAPI 3.1), made from the routes' own
marks (described.py) and the app's URL map, so a route and its description are one thing.

The JSON Schemas come from the marks' types through msgspec (a server dependency; nothing
of this is imported by the CLI).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from typing import Any

import msgspec
from quart import Response, jsonify
from quart_trio import QuartTrio
from werkzeug.routing import Rule

from oz0.server.api.common import ManagementState
from oz0.server.api.described import JSON, Described, Error, described, description_of

DOCUMENT_PATH = "/api/v1/openapi.json"
_REF = "#/components/schemas/{name}"
_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_NOT_OPERATIONS = frozenset({"HEAD", "OPTIONS"})
# Answered by any route that needs a person (the middle ones for any request: bad input,
# an unknown object, a body too large or not JSON, too many requests), and by any route at
# all when the database is away (503).
_COMMON_ERRORS = {
    "4XX": "refused: the one line says why (401 no certificate, 403 not allowed, "
    "404 not found, 400/413/415/422 bad input, 409 a conflict, 429 too many)",
    "503": "the cluster's database, or what the route needs, is unavailable; nothing changed",
}


class OpenApiDocument(typing.TypedDict):
    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]


def register(app: QuartTrio, state: ManagementState) -> None:
    made: list[OpenApiDocument] = []

    @app.get(DOCUMENT_PATH)
    @described(
        "This document: every route of the API, its input and its answers",
        answers={200: OpenApiDocument},
    )
    async def openapi_document() -> Response:
        # Made once, on first asking: every route is registered by then.
        if not made:
            made.append(document(app))
        return jsonify(made[0])


def api_rules(app: QuartTrio) -> Iterator[Rule]:
    """The app's routes that make the API (all but the web UI's pages and files)."""
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("web."):
            continue
        yield rule


def openapi_path(rule: Rule) -> str:
    """`/api/v1/jobs/<job_id>` as OpenAPI writes it: `/api/v1/jobs/{job_id}`."""
    return _PARAMETER.sub(r"{\1}", rule.rule)


def operations(rule: Rule) -> list[str]:
    return sorted(m.lower() for m in (rule.methods or ()) if m not in _NOT_OPERATIONS)


def document(app: QuartTrio) -> OpenApiDocument:
    """The OpenAPI 3.1 document of APP's described routes (an undescribed one is left out:
    tests/test_openapi.py fails on it)."""
    marked: list[tuple[Rule, str, Described]] = []
    for rule in api_rules(app):
        for method in operations(rule):
            found = description_of(app.view_functions[rule.endpoint], method.upper())
            if found is not None:
                marked.append((rule, method, found))
    types = _types_of([what for _, _, what in marked])
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    schema_of = dict(zip(map(_key, types), schemas, strict=True))
    paths: dict[str, Any] = {}
    for rule, method, what in marked:
        item = paths.setdefault(openapi_path(rule), {})
        item[method] = _operation(rule, method, what, schema_of)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "orchestrator-zero management API",
            "version": "1",
            "description": "Called with an operator's client certificate (TLS); every "
            'refusal is `{"error": "one line"}`.',
        },
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {k: _closed(v) for k, v in sorted(components.items())}},
    }


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A TypedDict's schema with no field besides those it names: answers carry none, and
    a body with another is refused (a misspelt field would be lost)."""
    if schema.get("type") == "object" and "properties" in schema:
        return {**schema, "additionalProperties": False}
    return schema


def _types_of(marked: list[Described]) -> list[Any]:
    found: dict[str, Any] = {_key(Error): Error}
    for what in marked:
        for answer in [*what.answers.values(), what.body]:
            if answer is not None and not isinstance(answer, str):
                found.setdefault(_key(answer), answer)
    return list(found.values())


def _key(kind: Any) -> str:
    return repr(kind)


def _operation(
    rule: Rule, method: str, what: Described, schema_of: dict[str, Any]
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": rule.endpoint
        if method != "post" or len(operations(rule)) == 1
        else f"{rule.endpoint}_{method}",
        "summary": what.summary,
        "parameters": [*_path_parameters(rule, what), *_query_parameters(what)],
        "responses": _responses(what, schema_of),
    }
    if what.notes:
        operation["description"] = what.notes
    if what.body is not None and method != "get":
        operation["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": schema_of[_key(what.body)]}},
        }
    elif method == "post":
        # A POST's body is JSON or it is refused (common.refuse_cross_site): one that
        # reads nothing takes `{}`.
        operation["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": {"type": "object", "additionalProperties": False}}},
        }
    return operation


def _path_parameters(rule: Rule, what: Described) -> Iterator[dict[str, Any]]:
    shapes = what.path or {}
    for name in _PARAMETER.findall(rule.rule):
        yield {
            "name": name,
            "in": "path",
            "required": True,
            "schema": dict(shapes.get(name, {"type": "string"})),
        }


def _query_parameters(what: Described) -> Iterator[dict[str, Any]]:
    if what.query is None:
        return
    required: frozenset[str] = getattr(what.query, "__required_keys__", frozenset())
    for name, kind in typing.get_type_hints(what.query).items():
        yield {
            "name": name,
            "in": "query",
            "required": name in required,
            "schema": msgspec.json.schema(kind),
        }


def _responses(what: Described, schema_of: dict[str, Any]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for status, kind in what.answers.items():
        answer: dict[str, Any] = {"description": _status_words(status)}
        if isinstance(kind, str):
            answer["content"] = {kind: {"schema": {"type": "string"}}}
        elif kind is not None:
            answer["content"] = {JSON: {"schema": schema_of[_key(kind)]}}
        answers[str(status)] = answer
    error = {JSON: {"schema": schema_of[_key(Error)]}}
    errors: dict[str, str] = {**_COMMON_ERRORS}
    errors |= {str(code): words for code, words in (what.errors or {}).items()}
    for code, words in errors.items():
        answers.setdefault(code, {"description": words, "content": error})
    return answers


def _status_words(status: int) -> str:
    words = {101: "switching protocols", 200: "done", 201: "created", 503: "not ready"}
    return words.get(status, str(status))
