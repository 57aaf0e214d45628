"""What the edge (oz0/server/edge/attempts.py) reads of the attempts a node reports on:
whether each is still the node's to run, and the lost-after of the jobs of those that are
(the edge paces the node's reports by it)."""

from __future__ import annotations

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.spec_text import LOST_AFTER
from oz0.jobs.store._records import Conn

# What an attempt is to the node that reports on it (attempts_of_node).
RUNNING, ENDED, CANCELLED, NOT_ITS = "running", "ended", "cancelled", "not its"


def attempts_of_node(conn: Conn, node_id: str, asked: list[tuple[str, int]]) -> list[str]:
    """For each (job, attempt number) in ASKED, in order, what it is to NODE_ID: RUNNING
    (placed on it and not ended), CANCELLED (placed on it and ended with its job's
    cancellation), ENDED (placed on it and ended otherwise), or NOT_ITS (placed on another
    node, or no such attempt). One statement for the batch (the edge's check of a node's
    attempt_alive and attempt_done, oz0/server/edge/attempts.py)."""
    if not asked:
        return []
    rows = conn.execute(
        "SELECT w.i, a.node_id = %s, a.state, a.ended_because"
        " FROM unnest(%s::text[], %s::int[]) WITH ORDINALITY AS w(job_id, number, i)"
        " LEFT JOIN job_attempts a ON a.job_id = w.job_id AND a.number = w.number",
        (node_id, [job for job, _ in asked], [number for _, number in asked]),
    ).fetchall()
    found = {int(r[0]): r[1:] for r in rows}
    answers = []
    for i in range(1, len(asked) + 1):
        mine, state, because = found.get(i, (None, None, None))
        if not mine:
            answers.append(NOT_ITS)
        elif state == "running":
            answers.append(RUNNING)
        else:
            answers.append(CANCELLED if because == EndReason.CANCELLED else ENDED)
    return answers


def lost_after_of(conn: Conn, job_ids: list[str]) -> dict[str, float]:
    """Each of JOB_IDS' lost-after in seconds, as its workflow has it (a default by its
    on-lost when none was asked: spec_text.LOST_AFTER)."""
    rows = conn.execute(
        "SELECT id, lost_after_s, on_lost FROM jobs WHERE id = ANY(%s)", (job_ids,)
    ).fetchall()
    return {
        str(job): float(seconds)
        if seconds is not None
        else LOST_AFTER.get(str(on_lost), LOST_AFTER["move"])
        for job, seconds, on_lost in rows
    }
