"""The API described (issue 45): every route of the management app is in the OpenAPI
document made from the routes' own marks (oz0/server/api/described.py), and the document
is valid OpenAPI 3.1."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from quart_trio import QuartTrio

from oz0.server.api import openapi
from oz0.server.api.common import ManagementState
from oz0.server.audit_follow import Followers
from oz0.server.management import create_app
from oz0.server.person_limits import PersonLimits
from oz0.web.live import Feed


def _app() -> QuartTrio:
    state = SimpleNamespace(
        db=None, cluster=SimpleNamespace(cluster_ca=None), hub=None, server_id="s",
        limits=PersonLimits(), followers=Followers(), live_pages=Feed(),
    )  # fmt: skip
    return create_app(cast(ManagementState, state))


@pytest.fixture(scope="module")
def app() -> QuartTrio:
    return _app()


@pytest.fixture(scope="module")
def document(app: QuartTrio) -> dict[str, Any]:
    return cast(dict[str, Any], openapi.document(app))


def test_every_route_of_the_api_is_in_the_document(
    app: QuartTrio, document: dict[str, Any]
) -> None:
    missing = []
    for rule in openapi.api_rules(app):
        item = document["paths"].get(openapi.openapi_path(rule), {})
        missing += [
            f"{m.upper()} {rule.rule} ({rule.endpoint})"
            for m in openapi.operations(rule)
            if m not in item
        ]
    assert not missing, f"routes the API's description leaves out: {missing}"


def test_the_document_has_no_route_the_app_lacks(app: QuartTrio, document: dict[str, Any]) -> None:
    served = {
        (openapi.openapi_path(rule), m)
        for rule in openapi.api_rules(app)
        for m in openapi.operations(rule)
    }
    described = {(p, m) for p, item in document["paths"].items() for m in item}
    assert described <= served


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    from openapi_spec_validator import validate

    validate(document)
