"""How the relay gathers a session's output into chunks of its recording
(oz0/server/api/sessions.py: `gather_batch`, `gather_after`), on Trio's mock clock: a flood is
gathered for up to GATHER after a write, a keystroke's echo is never held, and an exit is
not waited past. Starts no server and binds no address."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from oz0.server.api import sessions
from oz0.server.session_relay import NodeLine, SessionRelay
from oz0_common import session_messages as sm


async def _nothing(*_: Any, **__: Any) -> None:
    return None


def _output(n: int) -> dict[str, Any]:
    return {"type": sm.OUTPUT, "session": "s", "data": sm.encode_data(b"x" * n)}


def test_a_flood_is_gathered_and_an_echo_is_not_held() -> None:
    async def main() -> None:
        relay = SessionRelay()
        live = relay.open("s", NodeLine("node-1", "t", _nothing))
        start = trio.current_time()
        # After a small write nothing is held: the batch is what is there now.
        assert sessions.gather_after(start, 1) is None
        live.offer(_output(1))
        assert len(await sessions.gather_batch(live, sessions.gather_after(start, 1))) == 1
        assert trio.current_time() == start

        # After a large one, pieces that come in the next GATHER go into one batch.
        until = sessions.gather_after(start, sessions.HOLD_ABOVE)
        assert until == start + sessions.GATHER

        async def node_writes() -> None:
            for _ in range(5):
                live.offer(_output(4096))
                await trio.sleep(sessions.GATHER / 10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(node_writes)
            got = await sessions.gather_batch(live, until)
        assert len(got) == 5
        assert trio.current_time() == until

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_exit_is_not_waited_past_and_an_ended_session_ends_the_batch() -> None:
    async def main() -> None:
        relay = SessionRelay()
        live = relay.open("s", NodeLine("node-1", "t", _nothing))
        start = trio.current_time()
        live.offer(_output(4096))
        live.offer({"type": sm.EXIT, "session": "s", "code": 3})
        live.offer(_output(1))
        got = await sessions.gather_batch(live, start + sessions.GATHER)
        assert [m["type"] for m in got] == [sm.OUTPUT, sm.EXIT]
        assert trio.current_time() == start

        live.end("the node's stream ended")
        got = await sessions.gather_batch(live, trio.current_time() + sessions.GATHER)
        assert [m["type"] for m in got] == [sm.OUTPUT]
        assert await sessions.gather_batch(live, None) == []

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
