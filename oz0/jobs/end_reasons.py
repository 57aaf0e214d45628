"""Why an attempt ended: the words stored in `job_attempts.ended_because`, shown by the
command line and the web UI, and carried in the job workflow's payloads (AttemptEnd,
PartEnd, the `node_removed` signal, the `oz0.jobs.end_attempt` step's answer).

A StrEnum: each member is its string (`EndReason.EXIT == "exit"`, and it is written,
formatted and serialised as "exit"), so the rows and the workflow histories written with
plain strings read the same, and temporalio's converter gives the member back for a value
typed EndReason. The strings never change: they are in rows and in running workflows'
histories. Standard library only: the workflow imports it in the workers' sandbox
(tests/test_workflow_modules.py), and the command line may without loading the server.
"""

from __future__ import annotations

import enum


class EndReason(enum.StrEnum):
    # The command ended: it exited (with any code), or ran past the job's timeout.
    EXIT = "exit"
    TIMEOUT = "timeout"
    # The job was cancelled (or ended otherwise) while the attempt ran.
    CANCELLED = "cancelled"
    # Its node would not run it (the grant placement signed did not hold there): the job
    # fails, neither retried nor moved.
    REFUSED = "refused"
    # What became of its node (oz0/jobs/store/_node_fate.py `gone_because`): blocked,
    # purged, deleted, or lost (silent for the job's lost-after, or its runtime stopped, or
    # it never took the attempt).
    NODE_BLOCKED = "node blocked"
    NODE_PURGED = "node purged"
    NODE_DELETED = "node deleted"
    NODE_LOST = "node lost"
    # Its node could not open the secrets sealed to its key (renewed since): placed again,
    # sealed again to the new key.
    NODE_COULD_NOT_READ_SECRETS = "node could not read secrets"
    # Its node could not record the attempt as run (its data directory full or not
    # writable: oz0_node/jobs/grants.py RecordUnwritable), so did not run it: placed again.
    # Only in jobs whose workflow every server up knew it at its start (JobInput.unrecorded;
    # before: what became of the node, `node lost` while it is accepted).
    NODE_COULD_NOT_RECORD = "node could not record the attempt"

    @property
    def moves(self) -> bool:
        """Whether the attempt moves to another node: its node was taken away or lost, or
        could not read the secrets sealed to it. Not a failure: it does not count against
        `retries` (an `--all` job's part, which never moves, ends lost)."""
        return self in _MOVES


_MOVES = frozenset(
    {
        EndReason.NODE_BLOCKED,
        EndReason.NODE_PURGED,
        EndReason.NODE_DELETED,
        EndReason.NODE_LOST,
        EndReason.NODE_COULD_NOT_READ_SECRETS,
        EndReason.NODE_COULD_NOT_RECORD,
    }
)
