"""GET and POST /api/v1/tenants"""

from __future__ import annotations

import logging

from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import tenants
from oz0.errors import Oz0Error
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.temporal.namespaces import NamespaceTaken

log = logging.getLogger(__name__)


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/tenants")
    async def tenant_list() -> Response:
        await operator(state)
        rows = await state.db.transaction(tenants.list_tenants)
        return jsonify({"tenants": [t.to_json() for t in rows]})

    @app.post("/api/v1/tenants")
    async def tenant_create() -> Response:
        actor = await operator(state)
        name = (await json_object()).get("name")
        if not isinstance(name, str):
            raise ApiError(400, "body must be a JSON object with a `name`")
        try:
            tenants.check_name(name)
        except Oz0Error as e:
            raise ApiError(400, str(e)) from None
        if await state.db.transaction(lambda conn: tenants.exists(conn, name)):
            raise ApiError(409, f"tenant {name} already exists")
        # The namespace first: registering is idempotent, so a failure after it leaves
        # nothing a retry would trip over, while a tenant row without a namespace would.
        try:
            await state.temporal.register_tenant_namespace(name)
        except NamespaceTaken as e:
            raise ApiError(409, str(e)) from None
        except Exception as e:
            log.warning("registering namespace %s failed: %r", name, e)
            raise ApiError(503, f"could not register Temporal namespace {name}: {e}") from None
        try:
            tenant = await state.db.transaction(lambda conn: tenants.create(conn, name, actor))
        except tenants.TenantExists as e:
            raise ApiError(409, str(e)) from None
        return jsonify(tenant.to_json())
