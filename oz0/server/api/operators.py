"""POST /api/v1/operator/renew"""

from __future__ import annotations

from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import operators, pki
from oz0.server.api.common import ApiError, ManagementState, json_object, operator


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.post("/api/v1/operator/renew")
    async def operator_renew() -> Response:
        actor = await operator(state)
        body = await json_object()
        if not isinstance(body.get("csr"), str):
            raise ApiError(400, "body must be a JSON object with a PEM `csr`")
        try:
            public_key = pki.csr_public_key(body["csr"].encode())
        except ValueError as e:
            raise ApiError(400, f"bad certificate request: {e}") from None
        cert = await state.db.transaction(
            lambda conn: operators.issue_certificate(
                conn,
                state.cluster.cluster_ca,
                actor.name,
                public_key,
                actor=actor,
                action="operator.renew",
            )
        )
        # Refused here at once, not only once the notification comes back.
        state.operator_cache.forget(actor.name)
        return jsonify(
            {
                "certificate": pki.cert_to_pem(cert).decode(),
                "not_after": cert.not_valid_after_utc.isoformat(),
            }
        )
