"""A node runs a session only under a grant the cluster signed for that very session, on
that node, with that command (oz0_node/sessions.py, oz0/server/api/sessions.py's
`session_grant`); anything else is refused with one line and runs nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from fixtures.attempt_grants import check_for
from fixtures.node_attempts import CLUSTER_CA, NODE_ID
from oz0.server.api.sessions import session_grant
from oz0_common import session_messages as sm
from oz0_node.jobs.isolation import Isolation
from oz0_node.sessions import NodeSessions

OTHER_NODE = "node-ffffffffffff"
COMMAND = ["sh", "-c", "touch ran"]


class Recorder:
    """The stream's end of a NodeSessions: what it sends."""

    address = "edge.test:7443"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, kind: str, **fields: Any) -> None:
        self.sent.append({"type": kind, **fields})


def opening(
    session: str, grant: dict[str, str], command: list[str], user: str | None = None
) -> dict[str, object]:
    return {
        "type": sm.OPEN, "session": session, "grant": grant, "command": command,
        "rows": 24, "cols": 80, "user": user,
    }  # fmt: skip


async def refusal(
    tmp_path: Path, message: dict[str, object], users: frozenset[str] = frozenset()
) -> str:
    """What a node allowing sessions as USERS answers MESSAGE with: the reason it refused
    (it must refuse)."""
    edge = Recorder()
    sessions = NodeSessions(
        NODE_ID,
        edge,  # type: ignore[arg-type]
        Isolation.detect(tmp_path / "data"),
        lambda: check_for(CLUSTER_CA, NODE_ID, tmp_path),
        users=users,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sessions.run)
        await trio.testing.wait_all_tasks_blocked()
        await sessions.opened(message)
        nursery.cancel_scope.cancel()
    [answer] = edge.sent
    assert answer["type"] == sm.REFUSED, answer
    assert answer["session"] == message["session"]
    assert not (tmp_path / "ran").exists()
    return str(answer["reason"])


@pytest.mark.trio
async def test_a_grant_for_another_node_is_refused(tmp_path: Path) -> None:
    session = sm.new_id()
    grant = session_grant(CLUSTER_CA, "default", OTHER_NODE, session, COMMAND)
    reason = await refusal(tmp_path, opening(session, grant, COMMAND))
    assert reason == f"the grant names node_id {OTHER_NODE!r}, not {NODE_ID!r}"


@pytest.mark.trio
async def test_a_grant_for_another_session_or_command_is_refused(tmp_path: Path) -> None:
    granted = sm.new_id()
    grant = session_grant(CLUSTER_CA, "default", NODE_ID, granted, ["true"])
    reason = await refusal(tmp_path, opening(sm.new_id(), grant, ["true"]))
    assert reason == "the attempt's job_id is not the one the grant signed"
    reason = await refusal(tmp_path, opening(granted, grant, COMMAND))
    assert reason == "the attempt's command is not the one the grant signed"


@pytest.mark.trio
async def test_no_grant_or_another_tenant_is_refused(tmp_path: Path) -> None:
    session = sm.new_id()
    reason = await refusal(tmp_path, opening(session, {}, COMMAND))
    assert reason == "the grant has no payload and signature"
    grant = session_grant(CLUSTER_CA, "other", NODE_ID, session, COMMAND)
    reason = await refusal(tmp_path, opening(session, grant, COMMAND))
    assert reason == "the grant names tenant 'other', not 'default'"


@pytest.mark.trio
async def test_the_user_must_be_the_grant_s_and_one_the_node_allows(tmp_path: Path) -> None:
    """A session as a named user runs only if its grant names that user (an edge cannot
    add, drop or swap it) and the node lists the user (--session-users)."""
    allowed = frozenset({"daemon"})
    session = sm.new_id()
    grant = session_grant(CLUSTER_CA, "default", NODE_ID, session, COMMAND, "daemon")
    reason = await refusal(tmp_path, opening(session, grant, COMMAND), allowed)
    assert reason == "the attempt's user is not the one the grant signed"
    session = sm.new_id()
    grant = session_grant(CLUSTER_CA, "default", NODE_ID, session, COMMAND)
    reason = await refusal(tmp_path, opening(session, grant, COMMAND, "daemon"), allowed)
    assert reason == "the attempt's user is not the one the grant signed"
    session = sm.new_id()
    grant = session_grant(CLUSTER_CA, "default", NODE_ID, session, COMMAND, "root")
    reason = await refusal(tmp_path, opening(session, grant, COMMAND, "root"), allowed)
    assert reason == "this node does not allow sessions as root (oz0-node --session-users)"
