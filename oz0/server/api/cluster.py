"""GET /api/v1/cluster"""

from __future__ import annotations

from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import membership
from oz0.server.api.common import ManagementState, operator


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/cluster")
    async def cluster_info() -> Response:
        await operator(state)
        servers = await state.db.transaction(membership.servers_up)
        return jsonify(
            {
                "name": state.cluster.name,
                "ca_hash": state.cluster.ca_hash,
                "servers": [s.to_json() for s in servers],
            }
        )
