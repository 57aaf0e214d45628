"""The edge's sending of a node's streamed attempts (oz0/server/edge/deliveries.py) on
Trio's mock clock: the database and the node are stand-ins (what the stream sends is
recorded, the node's answers are given by the test), the event hub is the real one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
import trio
import trio.testing

from oz0.jobs import parts
from oz0.server.edge.common import Edge
from oz0.server.edge.deliveries import (
    NOT_TAKEN,
    NOT_TAKEN_AFTER,
    RESEND_AFTER,
    RETRY_AFTER,
    Deliveries,
)
from oz0.server.edge.wire import Wire
from oz0.store.events import ATTEMPTS, EventHub
from oz0.store.listen import Notification
from oz0_common.attempt_messages import Failure

NODE = "node-0123456789ab"
JOB = "job-0123456789ab"


class Stream:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_message(self, text: str) -> None:
        self.sent.append(json.loads(text))


@dataclass
class Ends:
    """The edge's part_ends: what it was asked to write and tell."""

    reports: list[parts.Report] = field(default_factory=list)
    # How many writes fail (the database away) before they work again.
    failing: int = 0

    async def record(self, report: parts.Report) -> parts.Recorded:
        if self.failing:
            self.failing -= 1
            raise psycopg.OperationalError("the database is away")
        self.reports.append(report)
        return parts.Recorded(parts.STORED)

    def tell(self, recorded: parts.Recorded) -> None:
        pass


@dataclass
class FakeEdge:
    """The parts of an Edge that deliveries.py uses; WAITING is what the node's rows say."""

    hub: EventHub = field(default_factory=lambda: EventHub(""))
    part_ends: Ends = field(default_factory=Ends)
    waiting: list[parts.Waiting] = field(default_factory=list)
    reads: int = 0

    @property
    def waiting_reads(self) -> FakeEdge:
        return self

    async def run(self, read: parts.WaitingRead) -> list[parts.Waiting]:
        assert read.node_id == NODE
        self.reads += 1
        return list(self.waiting)


def waiting(number: int) -> parts.Waiting:
    return parts.Waiting(JOB, number, {"job_id": JOB, "attempt": number}, 15.0)


def sends(stream: Stream, number: int) -> int:
    return sum(1 for m in stream.sent if m["attempt"]["attempt"] == number)


async def test_sent_at_once_again_until_answered_and_moved_if_never(
    autojump_clock: trio.testing.MockClock,
) -> None:
    edge, stream = FakeEdge(waiting=[waiting(1)]), Stream()
    deliveries = Deliveries(cast(Edge, edge), cast(Wire, stream), NODE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deliveries.run)
        await trio.sleep(1)
        assert stream.sent == [], "nothing before the node says it takes the stream"
        deliveries.node_takes_them()
        await trio.sleep(0.1)
        assert sends(stream, 1) == 1 and stream.sent[0]["type"] == "attempt"
        # A second part placed: the notification sends it at once; the first is not
        # sent again before its RESEND_AFTER.
        edge.waiting.append(waiting(2))
        edge.hub._dispatch(Notification(ATTEMPTS, NODE))
        await trio.sleep(0.1)
        assert (sends(stream, 1), sends(stream, 2)) == (1, 1)
        await deliveries.answered({"job": JOB, "attempt": 2, "taken": "started"})
        await trio.sleep(RESEND_AFTER)
        assert (sends(stream, 1), sends(stream, 2)) == (2, 1), "sent again until answered"
        await trio.sleep(NOT_TAKEN_AFTER)
        nursery.cancel_scope.cancel()
    [ended] = edge.part_ends.reports
    assert (ended.job_id, ended.number, ended.failure and ended.failure.type) == (JOB, 1, NOT_TAKEN)


async def test_what_the_node_did_not_run_ends_the_part_and_a_bad_answer_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    edge, stream = FakeEdge(waiting=[waiting(1), waiting(2), waiting(3)]), Stream()
    deliveries = Deliveries(cast(Edge, edge), cast(Wire, stream), NODE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deliveries.run)
        deliveries.node_takes_them()
        await trio.sleep(0.1)
        failure = {"type": "AttemptRefused", "message": "the grant expired 40 s ago"}
        refused = {"job": JOB, "attempt": 1, "taken": "refused", "failure": failure}
        await deliveries.answered(refused)
        await deliveries.answered({"job": JOB, "attempt": 2, "taken": "ran"})
        await deliveries.answered({"job": JOB, "attempt": 3, "taken": "refused"})  # no failure
        await deliveries.answered({"job": "job-../../x", "attempt": 3, "taken": "started"})
        await trio.sleep(RESEND_AFTER + 0.1)
        nursery.cancel_scope.cancel()
    assert [(r.number, r.failure) for r in edge.part_ends.reports] == [
        (1, Failure("AttemptRefused", "the grant expired 40 s ago")),
        (2, Failure("AttemptGone", "the node ran it before and has it no more")),
    ]
    assert sends(stream, 3) == 2, "a malformed answer is no answer: sent again"


async def test_an_answer_whose_end_could_not_be_written_is_asked_again_without_a_placement(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The node refused the part while the database was away: the part is sent again
    RETRY_AFTER later (no placement notifies meanwhile) until its end is written."""
    edge, stream = FakeEdge(waiting=[waiting(1)]), Stream()
    edge.part_ends.failing = 2
    deliveries = Deliveries(cast(Edge, edge), cast(Wire, stream), NODE)
    failure = {"type": "AttemptRefused", "message": "the grant expired 40 s ago"}
    refused = {"job": JOB, "attempt": 1, "taken": "refused", "failure": failure}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deliveries.run)
        deliveries.node_takes_them()
        for _ in range(3):  # the node answers each send
            await trio.sleep(0.1)
            await deliveries.answered(refused)
            assert edge.part_ends.reports == [] or edge.part_ends.failing == 0
            await trio.sleep(RETRY_AFTER)
        nursery.cancel_scope.cancel()
    assert sends(stream, 1) == 3, "sent again after each failed write, not after RESEND_AFTER"
    assert [r.failure for r in edge.part_ends.reports] == [Failure(**failure)]
