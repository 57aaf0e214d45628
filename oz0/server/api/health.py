"""GET /metrics, /healthz and /readyz: for monitoring, with no sign-in (none holds a
secret; oz0.server.metrics keeps IDs and tenant names out of the metrics, and adds the
node counts by tenant for an operator's certificate)."""

from __future__ import annotations

from typing import TypedDict

from prometheus_client import CONTENT_TYPE_LATEST
from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import access
from oz0.server.api.common import ApiError, ManagementState, operator
from oz0.server.api.described import described
from oz0.server.https import peer_cert_der
from oz0.store.outage import DATABASE_ERRORS

# Paths whose answer says nothing of the database (/metrics shows the last node counts
# while it is away).
WITHOUT_DATABASE = ("/metrics", "/healthz")


class Serving(TypedDict):
    status: str


class Ready(TypedDict):
    ready: bool


class NotReady(Ready):
    reasons: list[str]


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/metrics")
    @described(
        "Prometheus metrics (an operator's certificate adds its tenants' own)",
        answers={200: "text/plain"},
    )  # fmt: skip
    async def metrics() -> Response:
        text = await state.metrics.exposition()
        scraper = await _operator_scraping(state)
        if scraper is not None and scraper.has(access.Right.READ):
            text += state.metrics.tenant_exposition(scraper.reaches)
        return Response(text, content_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    @described("Whether the process answers", answers={200: Serving})
    async def healthz() -> Response:
        # The process answers: nothing else is asked, so a database outage does not
        # make an orchestrator restart servers that will work again once it is back.
        return jsonify({"status": "serving"})

    @app.get("/readyz")
    @described(
        "Whether this server is ready to serve, and if not why",
        answers={200: Ready, 503: NotReady},
    )  # fmt: skip
    async def readyz() -> tuple[Response, int]:
        reasons = await state.readiness.why_not()
        if reasons:
            return jsonify({"ready": False, "reasons": reasons}), 503
        return jsonify({"ready": True}), 200


async def _operator_scraping(state: ManagementState) -> access.Person | None:
    """The operator whose current certificate scrapes, if one does; None for anyone else,
    and while the database is away (the metrics answer without it)."""
    if peer_cert_der(request.scope) is None:
        return None
    try:
        return await operator(state)
    except ApiError:
        return None
    except DATABASE_ERRORS:
        return None
