"""GET /metrics, /healthz and /readyz: for monitoring, with no sign-in (none holds a
secret; oz0.server.metrics keeps IDs out of the metrics)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0.server.api.common import ManagementState

# Paths whose answer says nothing of the database (/metrics shows the last node counts
# while it is away).
WITHOUT_DATABASE = ("/metrics", "/healthz")


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await state.metrics.exposition(), content_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> Response:
        # The process answers: nothing else is asked, so a database outage does not
        # make an orchestrator restart servers that will work again once it is back.
        return jsonify({"status": "serving"})

    @app.get("/readyz")
    async def readyz() -> tuple[Response, int]:
        reasons = await state.readiness.why_not()
        if reasons:
            return jsonify({"ready": False, "reasons": reasons}), 503
        return jsonify({"ready": True}), 200
