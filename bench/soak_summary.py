"""The soak's report (issue 44): the figures of its JSON document besides `violations`:
faults by kind (done, skipped, failed), the workload's actions, jobs by outcome and by
kind, attempts ended other than by their command's exit, the bounds' p50/p99/max during
faults and outside them (a block's: the latest of its stream's and every server's
Temporal's refusal, each also apart), API errors, database connections, server and
Temporal host exits.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter, defaultdict
from typing import Any

from bench.measure import percentiles
from bench.soak_check import rss_changes
from bench.soak_faults import Fault
from bench.soak_model import Records
from bench.soak_state import Soak


def summary(soak: Soak, records: Records, schedule: list[Fault]) -> dict[str, Any]:
    jobs_by_state = Counter(j.state for j in records.jobs)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    states = {j.id: j.state for j in records.jobs}
    for job_id, (job, _) in soak.jobs.items():
        by_kind[job.kind][states.get(job_id, "unknown")] += 1
    moves = Counter(
        str(a.ended_because) for j in records.jobs for a in j.attempts
        if a.ended_because not in (None, "exit")
    )  # fmt: skip
    # Why sessions broke, without their IDs (so that alike ones count together).
    broken = Counter(
        re.sub(r"(session|node)-[0-9a-f]+", r"\1-…", s.error) for s in soak.sessions if s.error
    )
    # A block's effect: the latest of its stream's refusal and every server's Temporal's.
    during = [p.effect for p, d in zip(soak.blocks, soak.block_during_fault, strict=True) if d]
    outside = [p.effect for p, d in zip(soak.blocks, soak.block_during_fault, strict=True) if not d]
    temporal = [t for p in soak.blocks for _, t in p.temporal]
    return {
        "faults": dict(soak.faults_done),
        "faults_skipped": dict(soak.faults_skipped),
        "net_cuts": dict(soak.net_cuts),
        "faults_failed": dict(soak.faults_failed),
        "fault_schedule": [f.to_json() for f in schedule],
        "actions": dict(soak.actions),
        "jobs": dict(jobs_by_state),
        "jobs_by_kind": {k: dict(v) for k, v in by_kind.items()},
        "attempts_ended_other_than_exit": dict(moves),
        "attempts_truncated": sum(a.truncated for j in records.jobs for a in j.attempts),
        "ledger_runs": len(records.runs),
        "pushes": {
            "checked": len(records.pushes),
            "nodes": dict(Counter(n.result.split(":")[0] for p in records.pushes for n in p.nodes)),
            "unread": dict(soak.pushes_unread),
        },
        "sessions": {
            "opened": len(soak.sessions),
            "ended_by_exit": sum(s.exit_code is not None for s in soak.sessions),
            "broken": dict(broken),
            "recordings_read": sum(s.recorded is not None for s in records.sessions),
        },
        "changes": len(records.changes),
        "memory": memory(records),
        "bounds": {
            "block_ms": {
                "during_faults": percentiles([t for t in during if t is not None]),
                "outside_faults": percentiles([t for t in outside if t is not None]),
                "never": sum(t is None for t in during + outside),
                "exempt": [dataclasses.asdict(p) for p in soak.blocks if p.exempt],
                "request_to_answer": percentiles([p.asked for p in soak.blocks]),
                "answer_to_runtime_stopped": percentiles(soak.runtime_stopped),
                "answer_to_stream_refused": percentiles(
                    [p.took for p in soak.blocks if p.took is not None]
                ),
                "answer_to_temporal_refused": percentiles([t for t in temporal if t is not None]),
                "temporal_never_refused": sum(t is None for t in temporal),
                "temporal_probe_failures": soak.probe_failures,
            },
            "api_ms": {k: percentiles(v) for k, v in soak.api_ms.items()},
        },
        "api_errors": dict(soak.api_errors),
        "db_connections_max": max((n for _, n in soak.connections), default=None),
        "db_connection_bound": records.connection_bound,
        "db_connections_at_peak": soak.connections_at_peak,
        "server_exits": [dataclasses.asdict(e) for e in soak.exits],
        "temporal_host_exits": [dataclasses.asdict(e) for e in soak.host_exits],
    }


def memory(records: Records) -> dict[str, Any]:
    """Resident memory from the reference minute to the end (soak_check.rss_changes): each
    server's and Temporal host's, and the agents' growth as a distribution (a leak in all
    of them, or in a few)."""
    changes = rss_changes(records)
    agents = sorted(100 * c.growth for c in changes if c.name.startswith("agent "))
    return {
        "servers_and_hosts_mib": {
            f"{c.name} (pid {c.pid})": [round(c.before, 1), round(c.after, 1)]
            for c in changes
            if not c.name.startswith("agent ")
        },
        "agents_growth_pct": {
            "count": len(agents),
            **(
                {
                    "p50": round(statistics.median(agents), 1),
                    "p90": round(agents[int(0.9 * (len(agents) - 1))], 1),
                    "max": round(agents[-1], 1),
                }
                if agents
                else {}
            ),
            "over_10": sum(g > 10 for g in agents),
        },
        "agents_mib_at_end": sorted(
            round(c.after, 1) for c in changes if c.name.startswith("agent ")
        )[-3:],
    }
