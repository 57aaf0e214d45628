"""The jobs' rows: what operators list and show, and the output nodes send (placement.py
picks and records where attempts run); callers use them as `from oz0.jobs import store`
(or `from oz0.jobs.store import ...`) and the names below.

The workflow is the job's logic; these rows are its record, written by its activities (and
by the API when it is asked for a job or a cancellation), each change in one transaction.

The modules beside this one, each a concern, lowest first:

- `_records`: `Job`, `Attempt`, `Part` as operators see them, and `Conn`. No SQL.
- `_followers`: `tell_followers`, the notification a write sends whoever follows the job.
- `_reads`: one job (`get`), a listing (`list_jobs`), the attempts a node ran.
- `_creating`: a new job (`create`), refused past its tenant's cap of queued jobs.
- `_cancelling`: an operator's cancellation, and what the sweeper still has to tell
  workflows of it.
- `_starting`: the sweeper's claim of jobs whose workflow no server has started.
- `_node_fate`: what became of a node (`gone_because`), and the running attempts whose
  node was taken away.
- `_activity_writes`: what the workflow's activities lock and write (an attempt's end, the
  reason a job waits, the job's end and its times, for the metrics).
- `_output`: the output nodes send, stored up to its cap and read a bounded page at a time.
- `_node_answers`: what the edge answers a node about its attempts.
"""

from oz0.jobs.store._activity_writes import JobTimes, end_attempt, finish, locked_job, set_queued
from oz0.jobs.store._cancelling import cancel_sent, request_cancel, to_cancel
from oz0.jobs.store._creating import BATCH_SCHEMA, ScheduledRun, TenantNotFound, create
from oz0.jobs.store._followers import tell_followers
from oz0.jobs.store._node_answers import (
    CANCELLED,
    ENDED,
    NOT_ITS,
    RUNNING,
    attempts_of_node,
    lost_after_of,
)
from oz0.jobs.store._node_fate import (
    Removed,
    gone_because,
    node_fate,
    removal_signalled,
    removed_attempts,
)
from oz0.jobs.store._output import (
    MAX_CHUNK,
    MAX_PAGE_CHUNKS,
    OUTPUT_CAP,
    PAGE_BYTES,
    PAGE_CHUNKS,
    Chunk,
    ChunkJson,
    OutputPage,
    append_output,
    output_page,
)
from oz0.jobs.store._reads import MAX_LIST, NodeAttempt, attempts_on_node, get, list_jobs
from oz0.jobs.store._records import (
    ENDED_PART,
    NOT_STARTED,
    RUNNING_PART,
    WAITING,
    Attempt,
    Conn,
    Job,
    JobJson,
    Part,
)
from oz0.jobs.store._starting import (
    START_CLAIM,
    claim_unstarted,
    release_claim,
    set_streamed,
    started,
)

__all__ = [
    "BATCH_SCHEMA",
    "CANCELLED",
    "ENDED",
    "ENDED_PART",
    "MAX_CHUNK",
    "MAX_LIST",
    "MAX_PAGE_CHUNKS",
    "NOT_ITS",
    "NOT_STARTED",
    "OUTPUT_CAP",
    "PAGE_BYTES",
    "PAGE_CHUNKS",
    "RUNNING",
    "RUNNING_PART",
    "START_CLAIM",
    "WAITING",
    "Attempt",
    "Chunk",
    "ChunkJson",
    "Conn",
    "Job",
    "JobJson",
    "JobTimes",
    "NodeAttempt",
    "OutputPage",
    "Part",
    "Removed",
    "ScheduledRun",
    "TenantNotFound",
    "append_output",
    "attempts_of_node",
    "attempts_on_node",
    "cancel_sent",
    "claim_unstarted",
    "create",
    "end_attempt",
    "finish",
    "get",
    "gone_because",
    "list_jobs",
    "locked_job",
    "lost_after_of",
    "node_fate",
    "output_page",
    "release_claim",
    "removal_signalled",
    "removed_attempts",
    "request_cancel",
    "set_queued",
    "set_streamed",
    "started",
    "tell_followers",
    "to_cancel",
]
