"""Why an attempt ended (oz0/jobs/end_reasons.py): the strings rows and workflow histories
hold, which moves, and that Temporal's payloads are the same as when they were plain
strings, read back as the members."""

from __future__ import annotations

import dataclasses

from temporalio.converter import DataConverter

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow import AttemptEnd, Outcome, PartEnd

# As `job_attempts.ended_because` has them since the jobs' first release: never changed.
STORED = (
    "exit", "timeout", "cancelled", "refused", "node blocked", "node purged",
    "node deleted", "node lost", "node could not read secrets",
    "node could not record the attempt",
)  # fmt: skip


def test_the_reasons_are_the_strings_stored_and_every_one_spec_knows() -> None:
    assert [r.value for r in EndReason] == list(STORED)
    assert all(
        EndReason(s) == s and str(EndReason(s)) == s and f"{EndReason(s)}" == s for s in STORED
    )


def test_a_reason_moves_its_attempt_when_it_names_what_became_of_the_node() -> None:
    # What `because.startswith("node ")` said before the enum.
    assert [r for r in EndReason if r.moves] == [r for r in STORED if r.startswith("node ")]
    assert Outcome(EndReason.NODE_PURGED, None).moved
    assert not Outcome(EndReason.EXIT, 1).moved and not Outcome(EndReason.REFUSED, None).moved


@dataclasses.dataclass
class _PartEndBefore:
    """PartEnd as it was, its `because` a str."""

    number: int
    because: str
    exit_code: int | None = None
    refusal: str | None = None
    lost: str | None = None


def test_payloads_are_as_with_strings_and_read_back_as_the_members() -> None:
    converter = DataConverter.default.payload_converter
    end = PartEnd(3, EndReason.NODE_LOST, lost="stopped")
    [payload] = converter.to_payloads([end])
    [before] = converter.to_payloads([_PartEndBefore(3, "node lost", lost="stopped")])
    assert payload.data == before.data
    # A history written with plain strings (the signal, the step's answer) reads the same.
    [read] = converter.from_payloads([before], [PartEnd])
    assert read == end and read.because is EndReason.NODE_LOST
    [answer] = converter.to_payloads(["node purged"])
    assert converter.from_payloads([answer], [EndReason]) == [EndReason.NODE_PURGED]
    for because in (EndReason.TIMEOUT, None):
        [p] = converter.to_payloads([AttemptEnd("j", 1, because, None)])
        [back] = converter.from_payloads([p], [AttemptEnd])
        assert back.because is because
