"""Attempt grants: what the server that places an attempt signs so that its node runs it
(oz0_common/attempt_grant.py has the format; docs/node-protocol.md, "Signed attempts").

Signed with the cluster CA's key, which every server holds in memory (unsealed with the
master key at start, as for certificates and purge commands) and whose certificate every
node pinned at its join: no key to hand out or rotate, and nodes that joined before
grants existed check them with what they already hold.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oz0 import pki
from oz0.jobs.store import Job
from oz0.jobs.workflow import schedule_to_start
from oz0_common import attempt_grant

# Past the attempt's schedule-to-start bound, how long its grant still holds: the workflow
# starts the activity a moment after placement, and the node checks it a moment after that.
NOT_AFTER_MARGIN = dt.timedelta(seconds=30)


@dataclass(frozen=True)
class AttemptSigner:
    ca: pki.CertificateAuthority
    clock: Callable[[], float] = field(default=time.time)

    def grant(
        self,
        job: Job,
        number: int,
        node_id: str,
        *,
        secrets: str | None = None,
        limits: Mapping[str, Any] | None = None,
    ) -> dict[str, str]:
        """The grant for attempt NUMBER of JOB on NODE_ID: good until the attempt's
        schedule-to-start bound (and a margin) from now, so one that sat unrun expires."""
        bound = schedule_to_start(job.all_nodes, job.queue_timeout) + NOT_AFTER_MARGIN
        fields = attempt_grant.payload(
            cluster=self.ca.cluster,
            tenant=job.tenant,
            job_id=job.id,
            attempt=number,
            node_id=node_id,
            command=job.command,
            env_digest=attempt_grant.env_digest(job.env, secrets),
            limits=limits,
            timeout=job.timeout,
            not_after=math.ceil(self.clock() + bound.total_seconds()),
            files=job.files or None,
        )
        data = attempt_grant.signed_bytes(fields)
        return attempt_grant.encode(
            data, self.ca.key.sign(data, attempt_grant.signature_algorithm())
        )
