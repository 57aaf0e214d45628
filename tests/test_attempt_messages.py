"""The attempt messages of the control stream (oz0_common/attempt_messages.py) as they travel:
the wire form pinned field by field, what the node builds read by the edge's code as the
node meant it, and what the edge refuses of a node's word. No server: parsing only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from oz0.jobs import parts
from oz0.jobs.end_reasons import EndReason
from oz0.server.edge.control import HANDLERS
from oz0_common.attempt_messages import (
    ALIVE,
    ATTEMPT,
    DONE,
    DONE_ACK,
    MAX_RESULT,
    STOP,
    TAKEN,
    AttemptDone,
    AttemptResult,
    AttemptSent,
    AttemptTaken,
    BadAttemptMessage,
    EndedBecause,
    Failure,
    Taken,
)
from oz0_node.commands import HANDLERS as NODE_HANDLERS
from oz0_node.jobs import supervisor
from oz0_node.jobs.attempt import ATTEMPT_REFUSED, NODE_STOPPING
from oz0_node.jobs.attempt_files import AttemptStatus

JOB = "job-0123456789ab"
NODE = "node-0123456789ab"

# The wire, as docs/node-protocol.md shows it: changing a field's name or form breaks an
# agent or a server of the release before (rolling upgrades), so it fails here first.
WIRE: list[tuple[dict[str, Any], AttemptDone | AttemptTaken]] = [
    (
        {"job": JOB, "attempt": 2, "result": {
            "exit_code": 0, "signal": None, "ended_because": "exit", "output_bytes": 5,
            "truncated": False, "applied": {"memory_max": 67108864}, "output_complete": True,
        }},
        AttemptDone(JOB, 2, result=AttemptResult(
            0, None, EndedBecause.EXIT, 5, False, {"memory_max": 67108864}, True
        )),
    ),
    (
        {"job": JOB, "attempt": 1, "result": {
            "exit_code": None, "signal": 15, "ended_because": "timeout", "output_bytes": 0,
            "truncated": True, "applied": None, "output_complete": False,
        }},
        AttemptDone(JOB, 1, result=AttemptResult(
            None, 15, EndedBecause.TIMEOUT, 0, True, None, False
        )),
    ),
    (
        {"job": JOB, "attempt": 3, "failure": {"type": "NodeStopping", "message": "stopped"}},
        AttemptDone(JOB, 3, failure=Failure("NodeStopping", "stopped")),
    ),
    ({"job": JOB, "attempt": 4, "cancelled": True}, AttemptDone(JOB, 4, cancelled=True)),
    (
        {"job": JOB, "attempt": 5, "taken": "started"},
        AttemptTaken(JOB, 5, Taken.STARTED),
    ),
    ({"job": JOB, "attempt": 5, "taken": "ran"}, AttemptTaken(JOB, 5, Taken.RAN)),
    (
        {"job": JOB, "attempt": 6, "taken": "refused",
         "failure": {"type": "AttemptRefused", "message": "the grant expired"}},
        AttemptTaken(JOB, 6, Taken.REFUSED, Failure("AttemptRefused", "the grant expired")),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("wire", "typed"), WIRE)
def test_each_message_has_one_wire_form_both_ends_read_alike(
    wire: dict[str, Any], typed: AttemptDone | AttemptTaken
) -> None:
    assert typed.to_wire() == wire
    assert type(typed).parse(json.loads(json.dumps(wire))) == typed


def test_an_attempt_is_sent_as_placed_and_read_by_its_job_and_number() -> None:
    placed = {"job_id": JOB, "attempt": 7, "command": ["true"], "env": {}, "timeout": None}
    wire = AttemptSent(placed, 30.0).to_wire()
    assert wire == {"attempt": placed, "lost_after": 30.0}
    sent = AttemptSent.parse(json.loads(json.dumps(wire)))
    assert (sent.job, sent.number, sent.lost_after, sent.attempt) == (JOB, 7, 30.0, placed)
    # A lost-after the node cannot use is its default; a job or number it cannot is refused.
    for odd in (None, True, -1, float("inf"), 10**9):
        assert AttemptSent.parse({"attempt": placed, "lost_after": odd}).lost_after == 15.0
    for bad in ({"job_id": "job-../x", "attempt": 7}, {"job_id": JOB, "attempt": 0}, "x"):
        with pytest.raises(BadAttemptMessage):
            AttemptSent.parse({"attempt": bad, "lost_after": 30.0})


def test_a_result_from_an_agent_before_it_was_typed_reads_as_it_did() -> None:
    """The previous release's agent sends its supervisor's status as it was written (a
    "pid" with it, no output_complete); the edge took anything but "timeout" as an exit."""
    done = AttemptDone.parse({"job": JOB, "attempt": 1, "result": {
        "exit_code": 3, "signal": None, "ended_because": "exited?", "output_bytes": 9,
        "truncated": False, "applied": {}, "pid": 4242,
    }})  # fmt: skip
    assert done.result == AttemptResult(3, None, EndedBecause.EXIT, 9, False, {}, True)
    assert AttemptResult.parse({"exit_code": True}).exit_code is None  # not a number


def test_what_the_node_writes_as_a_status_the_edge_reads_as_the_part_end() -> None:
    """The supervisor's status file (supervisor._status), read by the manager
    (AttemptStatus.decode) and reported as it does (its result), read by the edge
    (AttemptDone.parse) into the part's end its workflow gets (parts.part_end)."""

    class Output:
        output_bytes, truncated = 12, False

    for because, code, sig, expected in [
        (EndedBecause.EXIT, 0, None, ("exit", 0)),
        (EndedBecause.EXIT, 137, 9, ("exit", 137)),
        (EndedBecause.TIMEOUT, None, 15, ("timeout", None)),
    ]:
        status = supervisor._status(code, sig, because, cast(Any, Output()), {"cpu_max": 1})
        written = AttemptStatus.decode(status.encode())  # through the status file
        wire = AttemptDone(JOB, 1, result=written.result).to_wire()
        done = AttemptDone.parse(json.loads(json.dumps(wire)))
        end, applied = parts.part_end(parts.Report.of(NODE, done), EndReason.NODE_LOST)
        assert (end.because, end.exit_code, applied) == (*expected, {"cpu_max": 1})


def test_a_failure_the_node_names_decides_the_part_end() -> None:
    refused = AttemptDone(JOB, 1, failure=Failure(ATTEMPT_REFUSED, "the grant expired"))
    end, _ = parts.part_end(
        parts.Report.of(NODE, AttemptDone.parse(refused.to_wire())), EndReason.NODE_LOST
    )
    assert (end.because, end.refusal) == (
        "refused",
        f"node {NODE} refused attempt 1: the grant expired",
    )
    stopping = AttemptDone(JOB, 2, failure=Failure(NODE_STOPPING, "stopping"))
    end, _ = parts.part_end(
        parts.Report.of(NODE, AttemptDone.parse(stopping.to_wire())), EndReason.NODE_BLOCKED
    )
    assert (end.because, end.lost) == ("node blocked", "stopped")  # as the node's fate says
    # A node that could not record the attempt as run (its disk full): moved, not failed.
    unrecorded = AttemptDone(JOB, 3, failure=Failure("RecordUnwritable", "No space left"))
    end, _ = parts.part_end(
        parts.Report.of(NODE, AttemptDone.parse(unrecorded.to_wire())), EndReason.NODE_LOST
    )
    assert (end.because, end.refusal) == ("node lost", None)  # a server up before it
    end, _ = parts.part_end(
        parts.Report.of(NODE, AttemptDone.parse(unrecorded.to_wire())), EndReason.NODE_LOST,
        unrecorded=True,
    )  # fmt: skip
    assert (end.because, end.because.moves) == ("node could not record the attempt", True)


def test_both_ends_handle_the_messages_the_other_sends() -> None:
    assert {ALIVE, DONE, TAKEN} <= set(HANDLERS)
    assert {ATTEMPT, DONE_ACK, STOP} <= set(NODE_HANDLERS)


def test_the_edge_refuses_what_is_not_a_report_before_it_asks_anything() -> None:
    big = {"exit_code": 0, "pad": "x" * MAX_RESULT}
    for bad in [
        {"job": "job-1", "attempt": 1, "cancelled": True},
        {"job": JOB, "attempt": 0, "cancelled": True},
        {"job": JOB, "attempt": True, "cancelled": True},
        {"job": JOB, "attempt": 1},
        {"job": JOB, "attempt": 1, "cancelled": True, "result": {}},
        {"job": JOB, "attempt": 1, "cancelled": False},
        {"job": JOB, "attempt": 1, "result": [0]},
        {"job": JOB, "attempt": 1, "result": big},
        {"job": JOB, "attempt": 1, "failure": {"type": "", "message": "x"}},
        {"job": JOB, "attempt": 1, "failure": {"type": "T" * 101, "message": "x"}},
        {"job": JOB, "attempt": 1, "failure": {"type": "T", "message": "m" * 4097}},
        {"job": JOB, "attempt": 1, "failure": "broke"},
    ]:
        with pytest.raises(BadAttemptMessage):
            AttemptDone.parse(bad)
    for bad_taken in [
        {"job": JOB, "attempt": 1, "taken": "maybe"},
        {"job": JOB, "attempt": 1, "taken": "refused"},  # no failure
        {"job": JOB, "attempt": 1, "taken": "failed", "failure": {"type": ""}},
        {"job": "job-../../x", "attempt": 1, "taken": "started"},
    ]:
        with pytest.raises(BadAttemptMessage):
            AttemptTaken.parse(bad_taken)
    # A node's long failure text is cut, not refused: the part still ends.
    long = {"type": "T" * 150, "message": "m" * 5000}
    cut = AttemptTaken.parse({"job": JOB, "attempt": 1, "taken": "failed", "failure": long})
    assert cut.failure == Failure("T" * 100, "m" * 4096)


def test_the_protocol_document_names_every_answer() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "node-protocol.md").read_text()
    for taken in Taken:
        assert f'"{taken}"' in doc, taken
