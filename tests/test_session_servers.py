"""How a session finds the server holding its node (cli.session_client.each_server): the
CLI's `node exec`/`node shell` and the soak's sessions go the same way."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import cast

import pytest

from cli.session_client import MAX_HOPS, Elsewhere, SessionError, each_server
from oz0.nodes import Node
from oz0.server.api.common import ManagementState
from oz0.server.api.sessions import Refused, _elsewhere


class Servers:
    """Each server's answer by address: an exit code, another server, or unreachable."""

    def __init__(self, answers: dict[str, int | Elsewhere | None]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def step(self, server: str) -> int | Elsewhere:
        self.asked.append(server)
        answer = self.answers[server]
        if answer is None:
            raise ConnectionRefusedError(111, "Connection refused")
        return answer


async def test_the_first_server_that_answers_gives_the_answer() -> None:
    servers = Servers({"a:8443": None, "b:8443": 3, "c:8443": 4})
    assert await each_server(["a:8443", "b:8443", "c:8443"], servers.step) == 3
    assert servers.asked == ["a:8443", "b:8443"]


async def test_a_server_naming_the_holder_sends_the_session_there_only() -> None:
    servers = Servers({"a:8443": Elsewhere("c:8443"), "b:8443": 1, "c:8443": 0})
    assert await each_server(["a:8443", "b:8443"], servers.step) == 0
    assert servers.asked == ["a:8443", "c:8443"]


async def test_servers_sending_the_session_round_stop_after_the_hops() -> None:
    servers = Servers({"a:8443": Elsewhere("b:8443"), "b:8443": Elsewhere("a:8443")})
    with pytest.raises(SessionError, match="from one to another"):
        await each_server(["a:8443"], servers.step)
    assert len(servers.asked) == MAX_HOPS


async def test_none_answering_is_one_error_naming_each() -> None:
    servers = Servers({"a:8443": None, "b:8443": None})
    with pytest.raises(SessionError) as raised:
        await each_server(["a:8443", "b:8443"], servers.step)
    assert str(raised.value) == (
        "no server of the context answered: a:8443: Connection refused; b:8443: Connection refused"
    )


async def test_a_node_whose_row_still_names_this_server_is_not_connected() -> None:
    # The stream ended here (a block) and its end is written just after: the server that
    # does not hold it says so, not that the node's server is down.
    node = Node(
        id="node-1", state="accepted", tenant="default", labels={}, hostname="h",
        token_id=None, reason=None, server="server-here", last_seen=dt.datetime.now(dt.UTC),
        joined_at=dt.datetime.now(dt.UTC), connected=True, has_certificate=True,
    )  # fmt: skip

    async def transaction(read: object) -> list[object]:
        return [SimpleNamespace(id="server-here", advertise="127.0.0.1")]  # this one is up

    state = cast(
        ManagementState,
        SimpleNamespace(server_id="server-here", db=SimpleNamespace(transaction=transaction)),
    )
    with pytest.raises(Refused, match=r"^node node-1 is not connected$"):
        await _elsewhere(state, node)
