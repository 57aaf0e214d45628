"""GET /api/v1/events: the audit log as it happens, one JSON object a line (NDJSON),
resumable from a cursor with nothing skipped and nothing twice, scoped as the audit list
is (docs/audit-events.md; the stream itself: oz0/server/audit_follow.py)."""

from __future__ import annotations

from typing import TypedDict

from quart import Response, request
from quart_trio import QuartTrio

from oz0 import audit_stream, pki
from oz0.server import audit_follow
from oz0.server.api.common import ApiError, ManagementState, operator
from oz0.server.api.described import described
from oz0.server.https import peer_cert_der

NDJSON = "application/x-ndjson"


class EventsQuery(TypedDict, total=False):
    # Where to start: a cursor the stream gave (an event's or a keep-alive's), or `start`
    # (the oldest row kept); none: what commits from now on.
    after: str
    # Only these actions: one (`node.accept`) or a family by its first parts (`node`:
    # node.accept, node.join.refused, ...); repeat for several.
    kind: list[str]
    # Seconds between keep-alive lines while there is nothing to send (1 to 300; 15).
    keepalive: int
    # false: send what is committed so far, then end (a catch-up); true (the default):
    # go on as rows commit.
    follow: bool


NOTES = (
    "A long-lived answer, `application/x-ndjson`: one JSON object a line, in the order the"
    " rows' transactions became complete. An event: `cursor`, `id`, `time`, `actor`"
    " (`kind`, `name`), `action`, `target`, `details`, `tenants`. A keep-alive, first and"
    " whenever nothing was sent for `keepalive` seconds: `keepalive` (true), `cursor`,"
    " `time`. The last line: `end` (why it ends), `cursor`, `time`. Resume with"
    " `after=` the last cursor read: nothing is skipped or sent twice. A person reads the"
    " rows the audit list shows it."
)


def register(app: QuartTrio, state: ManagementState) -> None:
    followers = state.followers

    @app.get("/api/v1/events")
    @described(
        "The audit log as it happens (NDJSON), from a cursor",
        query=EventsQuery,
        answers={200: NDJSON},
        errors={429: "the person holds its most event streams on this server"},
        notes=NOTES,
    )
    async def events_stream() -> Response:
        person = await operator(state)
        args = request.args
        try:
            kinds = audit_stream.kinds_of(args.getlist("kind"))
            after_raw = args.get("after")
            after = audit_stream.position_of(after_raw) if after_raw is not None else None
        except audit_stream.BadStreamQuery as e:
            raise ApiError(400, str(e)) from None
        keepalive = _whole(args.get("keepalive"), "keepalive", audit_follow.KEEPALIVE_DEFAULT,
                           audit_follow.KEEPALIVE_MIN, audit_follow.KEEPALIVE_MAX)  # fmt: skip
        follow = _yes_no(args.get("follow"), "follow", default=True)
        refused = followers.refusal(person.name)
        if refused is not None:
            raise refused
        if after is None:
            # Read before answering: the database away is a 503, not a broken stream.
            after = await state.db.transaction(audit_stream.now)
        der = peer_cert_der(request.scope)
        follower = audit_follow.Follower(
            person, identity=pki.identity_of_der(der) if der is not None else None
        )
        asked = audit_follow.Asked(after, kinds, float(keepalive), follow)
        lines = audit_follow.lines(state.db, state.hub, state.stopping, follower, asked)
        response = Response(
            followers.held(follower, lines),
            mimetype=NDJSON,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        # The whole answer's bound (Quart's, else a minute): a stream ends by itself
        # before; one whose client stopped reading is cut then.
        response.timeout = audit_follow.MAX_LIFE + 60
        return response


def _whole(raw: str | None, name: str, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not low <= int(raw) <= high:
        raise ApiError(400, f"{name} must be a whole number of seconds from {low} to {high}")
    return int(raw)


def _yes_no(raw: str | None, name: str, *, default: bool) -> bool:
    if raw is None:
        return default
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise ApiError(400, f"{name} must be true or false")
