"""GET and POST /api/v1/tenants, GET and PATCH /api/v1/tenants/<name>"""

from __future__ import annotations

from typing import TypedDict

from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import tenants
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described


class Tenants(TypedDict):
    tenants: list[tenants.TenantJson]


_REFUSED = {404: "no such tenant (or not one's own)", 409: "the tenant exists already"}


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/tenants")
    @described("Tenants one reaches", answers={200: Tenants})
    async def tenant_list() -> Response:
        scope = (await operator(state)).scope
        rows = await state.db.transaction(lambda conn: tenants.list_tenants(conn, scope=scope))
        return jsonify({"tenants": [t.to_json() for t in rows]})

    @app.post("/api/v1/tenants")
    @described(
        "Make a tenant (and its Temporal namespace)", body=tenants.NewTenantBody,
        answers={200: tenants.TenantJson}, errors=_REFUSED,
    )  # fmt: skip
    async def tenant_create() -> Response:
        actor = await operator(state)
        body = await json_object()
        name = body.get("name")
        if not isinstance(name, str):
            raise ApiError(400, "body must be a JSON object with a `name`")
        try:
            settings = tenants.Settings.from_json(body, also=("name",))
            tenant = await tenants.create_with_namespace(
                state.db, state.temporal, name, actor, settings
            )
        except tenants.TenantRefused as e:
            raise ApiError(e.status, str(e)) from None
        return jsonify(tenant.to_json())

    @app.get("/api/v1/tenants/<name>")
    @described("A tenant and its caps", answers={200: tenants.TenantJson}, errors=_REFUSED)
    async def tenant_show(name: str) -> Response:
        scope = (await operator(state)).scope
        try:
            tenant = await state.db.transaction(lambda conn: tenants.get(conn, name, scope=scope))
        except tenants.TenantRefused as e:
            raise ApiError(e.status, str(e)) from None
        return jsonify(tenant.to_json())

    @app.patch("/api/v1/tenants/<name>")
    @described(
        "Change a tenant's caps", body=tenants.SettingsBody, answers={200: tenants.TenantJson},
        errors=_REFUSED,
    )  # fmt: skip
    async def tenant_set(name: str) -> Response:
        actor = await operator(state)
        try:
            settings = tenants.Settings.from_json(await json_object())
            tenant = await tenants.set_with_namespace(
                state.db, state.temporal, name, settings, actor, scope=actor.scope
            )
        except tenants.TenantRefused as e:
            raise ApiError(e.status, str(e)) from None
        return jsonify(tenant.to_json())
