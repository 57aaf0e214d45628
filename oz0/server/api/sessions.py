"""WEBSOCKET /api/v1/nodes/<id>/session: a person's interactive session on a node
(docs/sessions.md; the messages: oz0_common/session_messages.py).

Who: an operator certificate of a person whose role operates (operator, admin) in the
node's tenant; another tenant's node is not found; as a named account of the node (`user`:
`node shell --user`), its admins only (access.NAMED_USER_SESSIONS). Where: the server
holding the node's control stream relays it (server/session_relay.py); any other answers
`elsewhere` with that server's management address. What the node runs is what the
cluster CA signed for this session (`session_grant`): the node refuses anything else.

While it lasts it is recorded (server/session_recording.py), and it ends when its person
may no longer open it (removed, demoted, the tenant taken away: looked at every
PERSON_CHECK, from the operator cache that notifications keep current), when it has been
idle or has lasted as long as the cluster allows, and when the node's stream ends here (a
block, purge or delete). It opens and ends with an audit row each (`session.start`,
`session.end`: person, node, command; how it ended, how long, how many bytes each way).

Every refusal is one `error` message, then the websocket closes: the CLI prints it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import trio
from quart import websocket
from quart_trio import QuartTrio

from oz0 import access, audit, membership, node_sessions, nodes, pki
from oz0.server import https
from oz0.server.api.common import ManagementState, current_person, is_operator_of
from oz0.server.api.described import described
from oz0.server.api.nodes import NODE_ID
from oz0.server.session_recording import Recording
from oz0.server.session_relay import LineGone, LiveSession, NodeLine
from oz0_common import attempt_grant
from oz0_common import session_messages as sm

log = logging.getLogger(__name__)

# The first message (`open`) comes within this of the websocket's opening.
OPEN_TIMEOUT = 10.0
# A session grant's life: the node checks it a moment after it is signed.
GRANT_LIFE = 60
# The node answers an open (started or refused) within this.
START_TIMEOUT = 30.0
# How often a live session's person is looked at again (removed, demoted, re-scoped).
PERSON_CHECK = 0.5
# Output the relay takes into one chunk of the recording at most, in messages.
BATCH = 64
# While output streams (the last chunk held HOLD_ABOVE bytes or more), the relay gathers
# it for up to GATHER after its last write began before it writes again: a flood costs
# about ten chunk writes a second instead of one a read of the PTY (each a transaction;
# bench.sessions' recording_alone), while a keystroke's echo (a few bytes) is never held.
GATHER = 0.1
HOLD_ABOVE = 8 * 1024


class Refused(Exception):
    """Said to the person as one `error` line, and the session ends."""


def session_grant(
    ca: pki.CertificateAuthority,
    tenant: str,
    node_id: str,
    session: str,
    command: list[str],
    user: str | None = None,
) -> dict[str, str]:
    """The grant that lets NODE_ID run SESSION's COMMAND, as USER if it names one
    (oz0_common/session_messages.py's `grant_fields` over the attempt grant's format)."""
    given = sm.grant_fields(session, command, user)
    fields = attempt_grant.payload(
        cluster=ca.cluster,
        tenant=tenant,
        job_id=session,
        attempt=given["attempt"],
        node_id=node_id,
        command=command,
        env_digest=attempt_grant.env_digest(given["env"], given["secrets"]),
        limits=given["limits"],
        timeout=given["timeout"],
        not_after=math.ceil(time.time() + GRANT_LIFE),
        user=user,
    )
    data = attempt_grant.signed_bytes(fields)
    return attempt_grant.encode(data, ca.key.sign(data, attempt_grant.signature_algorithm()))


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.websocket("/api/v1/nodes/<node_id>/session")
    @described(
        "A shell session on a node: a WebSocket (upgrade), then JSON messages",
        answers={101: None},
        path={"node_id": NODE_ID},
        notes="The messages are oz0_common/session_messages.py's; a refusal is one "
        '`{"type": "error", "message": ...}` message before the close.',
    )  # fmt: skip
    async def node_session(node_id: str) -> None:
        await websocket.accept()
        try:
            await _serve(state, node_id)
        except Refused as e:
            await _send("error", message=str(e))
        await websocket.close(1000)


async def _send(kind: str, **fields: Any) -> None:
    await websocket.send(json.dumps({"type": kind, **fields}))


async def _receive() -> dict[str, Any]:
    raw = await websocket.receive()
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise Refused("the client sent something that is not a session message")
    return message


async def _person(state: ManagementState) -> tuple[access.Person, pki.Identity]:
    der = https.peer_cert_der(websocket.scope)
    if der is None:
        raise Refused("an operator client certificate is required")
    identity = pki.identity_of_der(der)
    if not is_operator_of(state, identity):
        raise Refused("this certificate does not belong to an operator of this cluster")
    person = await current_person(state, identity)
    if person is None:
        raise Refused(f"operator {identity.name} is unknown or this certificate was replaced")
    https.authenticated(websocket.scope)
    return person, identity


def _may_open(person: access.Person, tenant: str) -> None:
    try:
        person.check(access.Right.OPERATE, "open sessions on nodes", tenant=tenant)
    except access.Forbidden as e:
        raise Refused(str(e)) from None


async def _serve(state: ManagementState, node_id: str) -> None:
    person, identity = await _person(state)

    def read(conn: Any) -> tuple[nodes.Node, node_sessions.Settings]:
        return nodes.get(conn, node_id, scope=person.scope), node_sessions.Settings.read(conn)

    try:
        node, settings = await state.db.transaction(read)
    except nodes.NodeError as e:
        raise Refused(str(e)) from None
    _may_open(person, node.tenant)
    master_key = state.cluster.master_key
    if master_key is None:
        raise Refused("this server does not hold the master key: it cannot record sessions")
    opening: dict[str, Any] | None = None
    with trio.move_on_after(OPEN_TIMEOUT):
        opening = await _receive()
    if opening is None or opening.get("type") != "open":
        raise Refused("the session was not opened (no `open` message)")
    try:
        command = sm.command_of(opening)
        size = sm.WindowSize.of(opening)
        mode = sm.Mode.of(opening)
    except sm.BadSessionMessage as e:
        raise Refused(str(e)) from None
    if mode.user is not None:
        # As a named account (which the node must allow too): its tenant's admins only.
        rule = access.NAMED_USER_SESSIONS
        try:
            person.check(rule.right, rule.doing, tenant=node.tenant)
        except access.Forbidden as e:
            raise Refused(str(e)) from None
    term = opening.get("term") if isinstance(opening.get("term"), str) else None
    line = state.sessions.line(node_id)
    if line is None:
        await _elsewhere(state, node)
        return
    session_id = sm.new_id()
    header = {
        "version": 2,
        "width": size.cols,
        "height": size.rows,
        "timestamp": int(time.time()),
        "env": {"TERM": term or ""},
        "title": f"{person.name} on {node_id}: {' '.join(command)}",
    }
    details = {"node": node_id, "command": command, "person": person.name, "user": mode.user}

    def opened(conn: Any) -> None:
        node_sessions.create(
            conn, session_id, tenant=line.tenant, node_id=node_id, person=person.name,
            command=command, header=header, server=state.server_id,
            records_input=settings.record_input, run_as=mode.user,
        )  # fmt: skip
        audit.record(
            conn, person.actor, "session.start", session_id, details, tenants=[line.tenant]
        )

    await state.db.transaction(opened)
    recording = Recording(
        state.db, master_key, state.cluster.name, session_id, records_input=settings.record_input
    )
    live = state.sessions.open(session_id, line)
    relay = _Relay(state, live, line, recording, identity, settings)
    try:
        await _to_line(
            line,
            sm.OPEN, session=session_id,
            grant=sm_grant(state, line, session_id, command, mode.user),
            command=command, term=term, **size.fields(), **mode.fields(),
        )  # fmt: skip
        await relay.run()
    finally:
        state.sessions.close(live)
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            if relay.code is None:
                # The stream may be gone already: the node ended the session then.
                with contextlib.suppress(LineGone):
                    await line.send(sm.CLOSE, session=session_id, why=relay.why or "closed")
            await recording.flush()
            ended = {
                **details,
                "exit_code": relay.code,
                "why": relay.why,
                "seconds": round(trio.current_time() - relay.began, 3),
                "input_bytes": recording.input_bytes,
                "output_bytes": recording.output_bytes,
            }

            def closed(conn: Any) -> None:
                # Not twice: another server may have ended it, this one taken for stopped.
                if node_sessions.finish(conn, session_id, relay.code, relay.why):
                    audit.record(
                        conn, person.actor, "session.end", session_id, ended,
                        tenants=[line.tenant],
                    )  # fmt: skip
                else:
                    log.warning(
                        "session %s was ended in the records by another server (this one "
                        "taken for stopped) before it ended here: %s", session_id,
                        relay.why or f"exit code {relay.code}",
                    )  # fmt: skip

            await state.db.transaction(closed)


def sm_grant(
    state: ManagementState,
    line: NodeLine,
    session_id: str,
    command: list[str],
    user: str | None = None,
) -> dict[str, str]:
    return session_grant(
        state.cluster.cluster_ca, line.tenant, line.node_id, session_id, command, user
    )


async def _elsewhere(state: ManagementState, node: nodes.Node) -> None:
    """The node's stream is not held here: name the server that holds it, if one does."""
    # A row naming this server is news this server has outrun: the stream ended here (a
    # block, a drop) and its end is written just after, so the node is not connected.
    if not node.connected or node.server is None or node.server == state.server_id:
        raise Refused(f"node {node.id} is not connected")
    servers = await state.db.transaction(membership.servers_up)
    for server in servers:
        if server.id == node.server and server.id != state.server_id:
            await _send("elsewhere", server=server.advertise)
            return
    raise Refused(f"node {node.id} is not connected to a server that is up")


class _Relay:
    """Between the person and the node, until the session ends: `code` is its exit code,
    or None and `why` says why it ended without one."""

    def __init__(
        self,
        state: ManagementState,
        live: LiveSession,
        line: NodeLine,
        recording: Recording,
        identity: pki.Identity,
        settings: node_sessions.Settings,
    ) -> None:
        self.state, self.live, self.line = state, live, line
        self.recording, self.identity, self.settings = recording, identity, settings
        self.began = self.active = trio.current_time()
        self.code: int | None = None
        self.why: str | None = None

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._to_person, nursery.cancel_scope)
                nursery.start_soon(self._to_node)
                nursery.start_soon(self._watch, nursery.cancel_scope)
        except BaseExceptionGroup as group:
            _raise_one(group)

    def _end(self, scope: trio.CancelScope, why: str) -> None:
        if self.code is None and self.why is None:
            self.why = why
        scope.cancel()

    async def _to_person(self, scope: trio.CancelScope) -> None:
        live = self.live
        with trio.move_on_after(START_TIMEOUT) as starting:
            first = await _next(live)
        if starting.cancelled_caught or first is None:
            self._end(scope, live.why or "the node did not start the session")
            raise Refused(f"the session ended: {self.why}")
        if first.get("type") == sm.REFUSED:
            self.why = f"refused: {first.get('reason')}"
            raise Refused(f"node {live.node_id} refused the session: {first.get('reason')}")
        await _send("started", session=live.id, user=first.get("user"))
        gather_until: float | None = None
        while True:
            batch = await gather_batch(live, gather_until)
            if not batch:
                self._end(scope, live.why or "the node's stream ended")
                raise Refused(f"the session ended: {self.why}")
            shown: list[dict[str, Any]] = []
            shown_bytes = 0
            exit_code: int | None = None
            for message in batch:
                kind = message.get("type")
                if kind == sm.OUTPUT:
                    try:
                        piece = sm.data_of(message)
                    except sm.BadSessionMessage:
                        continue
                    self.recording.output(piece)
                    shown_bytes += len(piece)
                    # Stderr (a command without a PTY) is recorded as output too.
                    stream = {"stream": sm.STDERR} if message.get("stream") == sm.STDERR else {}
                    shown.append({"data": message["data"], **stream})
                elif kind == sm.EXIT:
                    try:
                        exit_code = sm.exit_code_of(message)
                    except sm.BadSessionMessage:
                        exit_code = 255
                    break
            if shown:
                self.active = began = trio.current_time()
                # Recorded before it is shown: a server killed now has lost nothing seen.
                await self.recording.flush()
                gather_until = gather_after(began, shown_bytes)
                for fields in shown:
                    await _send("output", **fields)
            if exit_code is not None:
                self.code = exit_code
                await _send("exit", code=exit_code)
                scope.cancel()
                return

    async def _to_node(self) -> None:
        live, line = self.live, self.line
        while True:
            message = await _receive()
            kind = message.get("type")
            if kind == "input":
                try:
                    data = sm.data_of(message)
                except sm.BadSessionMessage as e:
                    raise Refused(str(e)) from None
                self.active = trio.current_time()
                self.recording.input(data)
                eof = {"eof": True} if message.get("eof") is True else {}
                await _to_line(line, sm.INPUT, session=live.id, data=message["data"], **eof)
            elif kind == "resize":
                try:
                    size = sm.WindowSize.of(message)
                except sm.BadSessionMessage as e:
                    raise Refused(str(e)) from None
                self.recording.resize(size.rows, size.cols)
                await _to_line(line, sm.RESIZE, session=live.id, **size.fields())

    async def _watch(self, scope: trio.CancelScope) -> None:
        """End the session once idle or too long, once its person may no longer, or once
        this server has written no heartbeat for so long that the others take it for
        stopped (and end its sessions' rows: oz0/server/session_sweeper.py)."""
        settings = self.settings
        while True:
            await trio.sleep(PERSON_CHECK)
            now = trio.current_time()
            beat = self.state.metrics.heartbeat_age()
            if beat is not None and beat >= membership.UP_WINDOW.total_seconds():
                # The other servers take this one for stopped and end its sessions' rows.
                why = f"its server wrote no heartbeat for {beat:.0f} s"
            elif now - self.began >= settings.max_length:
                why = f"it reached the cluster's maximum length ({settings.max_length:g} s)"
            elif now - self.active >= settings.idle_timeout:
                why = f"it was idle for {settings.idle_timeout:g} s"
            else:
                person = await current_person(self.state, self.identity)
                why = None
                if person is None:
                    why = f"operator {self.identity.name} was removed"
                else:
                    try:
                        _may_open(person, self.line.tenant)
                    except Refused as e:
                        why = f"{e} any more"
            if why is not None:
                self._end(scope, why)
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await _send("error", message=f"the session ended: {why}")
                return


async def _to_line(line: NodeLine, kind: str, **fields: Any) -> None:
    try:
        await line.send(kind, **fields)
    except LineGone:
        raise Refused(f"the session ended: node {line.node_id}'s stream ended") from None


def _raise_one(group: BaseExceptionGroup[BaseException]) -> None:
    """The first Refused of GROUP, for the person, if all else in it is cancellations;
    else GROUP as it came."""
    leaves = list(_leaves(group))
    refused = [e for e in leaves if isinstance(e, Refused)]
    if refused and all(isinstance(e, Refused | trio.Cancelled) for e in leaves):
        raise refused[0] from None
    raise group


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


async def _next(live: LiveSession) -> dict[str, Any] | None:
    try:
        return await live.messages.receive()
    except trio.EndOfChannel:
        return None


def gather_after(began: float, written: int) -> float | None:
    """Until when the next batch of output is gathered, after a write of WRITTEN bytes that
    began at BEGAN: only while output streams (see GATHER)."""
    return began + GATHER if written >= HOLD_ABOVE else None


async def gather_batch(
    live: LiveSession, gather_until: float | None = None
) -> list[dict[str, Any]]:
    """The next message from the node and whatever else came meanwhile, or (GATHER_UNTIL)
    comes until then, BATCH at most and none after an exit; empty once the session has
    ended on this side."""
    first = await _next(live)
    if first is None:
        return []
    batch = [first]
    while len(batch) < BATCH and batch[-1].get("type") != sm.EXIT:
        try:
            batch.append(live.messages.receive_nowait())
            continue
        except trio.EndOfChannel:
            break
        except trio.WouldBlock:
            if gather_until is None:
                break
        with trio.move_on_at(gather_until):
            more = await _next(live)
            if more is None:
                break
            batch.append(more)
            continue
        break
    return batch
