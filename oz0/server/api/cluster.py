"""GET and PATCH /api/v1/cluster"""

from __future__ import annotations

from typing import Any, TypedDict

import psycopg
from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import audit, membership, node_labels, node_sessions
from oz0 import retention_rules as rules
from oz0.errors import Oz0Error
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described


class ClusterSettings(node_sessions.SettingsJson):
    audit_retention: str
    audit_retention_seconds: int | None
    lock_node_labels: bool


class ClusterInfo(ClusterSettings):
    name: str
    ca_hash: str
    servers: list[membership.ServerJson]


class ClusterChange(TypedDict, total=False):
    """What `cluster set` changes (at least one)."""

    # Seconds, a duration ("90d") or "keep"; null: keep for ever.
    audit_retention: int | str | None
    lock_node_labels: bool
    session_record_input: bool
    session_idle_timeout_seconds: int
    session_max_seconds: int


SETTINGS = tuple(ClusterChange.__annotations__)
# The longest a session's idle timeout or length may be set to: a week.
MAX_SESSION_SECONDS = 7 * 86400


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/cluster")
    @described("The cluster: its servers up and its settings", answers={200: ClusterInfo})
    async def cluster_info() -> Response:
        await operator(state)
        servers, settings = await state.db.transaction(
            lambda conn: (membership.servers_up(conn), _settings(conn))
        )
        return jsonify(
            {
                "name": state.cluster.name,
                "ca_hash": state.cluster.ca_hash,
                "servers": [s.to_json() for s in servers],
                **settings,
            }
        )

    @app.patch("/api/v1/cluster")
    @described("Change the cluster's settings", body=ClusterChange, answers={200: ClusterSettings})
    async def cluster_set() -> Response:
        actor = await operator(state)
        body = await json_object()
        unknown = sorted(set(body) - set(SETTINGS))
        if unknown:
            raise ApiError(400, f"unknown setting {unknown[0]!r}: give {' or '.join(SETTINGS)}")
        if not body:
            raise ApiError(400, f"nothing to change: give {' or '.join(SETTINGS)}")
        seconds = _retention(body["audit_retention"]) if "audit_retention" in body else None
        locked = body.get("lock_node_labels")
        if "lock_node_labels" in body and not isinstance(locked, bool):
            raise ApiError(400, "lock_node_labels must be true or false")

        session_changes = _session_changes(body)

        def change(conn: psycopg.Connection[Any]) -> dict[str, object]:
            if session_changes:
                changed = node_sessions.set_settings(conn, session_changes)
                audit.record(conn, actor, "cluster.set", "cluster", changed)
            if "audit_retention" in body:
                audit.set_retention(conn, seconds, actor)
            if isinstance(locked, bool):
                node_labels.set_cluster_lock(conn, locked, actor)
            return _settings(conn)

        try:
            return jsonify(await state.db.transaction(change))
        except Oz0Error as e:
            raise ApiError(400, str(e)) from None


def _session_changes(body: dict[str, Any]) -> dict[str, Any]:
    """The session settings BODY changes, by their column's name; 400 if one is invalid."""
    changes: dict[str, Any] = {}
    if "session_record_input" in body:
        if not isinstance(body["session_record_input"], bool):
            raise ApiError(400, "session_record_input must be true or false")
        changes["record_input"] = body["session_record_input"]
    for name, column in (("session_idle_timeout_seconds", "idle_timeout_s"),
                         ("session_max_seconds", "max_s")):  # fmt: skip
        if name in body:
            value = body[name]
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 < value <= MAX_SESSION_SECONDS
            ):
                raise ApiError(400, f"{name} must be 1 to {MAX_SESSION_SECONDS} seconds")
            changes[column] = value
    return changes


def _retention(value: object) -> int | None:
    """The audit retention VALUE asks for, in seconds (None: keep for ever); 400 if none."""
    try:
        if value is not None and (isinstance(value, bool) or not isinstance(value, str | int)):
            raise rules.RetentionError("audit_retention must be seconds, a duration or keep")
        return rules.audit_retention(value)
    except rules.RetentionError as e:
        raise ApiError(400, str(e)) from None


def _settings(conn: psycopg.Connection[Any]) -> dict[str, object]:
    kept = audit.retention(conn)
    return {
        "audit_retention": rules.describe(kept),
        "audit_retention_seconds": kept,
        "lock_node_labels": node_labels.cluster_locked(conn),
        **node_sessions.Settings.read(conn).to_json(),
    }
