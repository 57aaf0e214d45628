"""The answers a node sends on its control stream to purge commands, as the purge reads
them (oz0.server.edge.control.PurgeAnswers): however many the node sent unasked, the
answer to the command sent reaches the purge (test_join_flood's end-to-end test sends 200
first, and lost the real answer now and then while a full queue refused the newest)."""

from __future__ import annotations

import trio
import trio.testing

from oz0.server.edge.control import ANSWERS_KEPT, PurgeAnswers


def answer(nonce: str) -> dict[str, str]:
    return {"type": "purge_refused", "nonce": nonce}


async def test_the_latest_answer_survives_any_number_sent_before_it() -> None:
    answers = PurgeAnswers()
    for i in range(200):
        answers.offer(answer(f"unasked-{i}"))
    answers.offer(answer("the command's"))
    read = [(await answers.next())["nonce"] for _ in range(ANSWERS_KEPT)]
    assert read == [*(f"unasked-{i}" for i in range(201 - ANSWERS_KEPT, 200)), "the command's"]


async def test_the_purge_waits_for_an_answer_and_gets_it_once() -> None:
    answers = PurgeAnswers()
    got: list[str] = []

    async def purge() -> None:
        got.append((await answers.next())["nonce"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(purge)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        answers.offer(answer("n1"))
    assert got == ["n1"]
    with trio.move_on_after(0.1) as waiting:
        await answers.next()
    assert waiting.cancelled_caught
