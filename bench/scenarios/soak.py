"""An hour of faults under load, checked by a ledger on the nodes (issue 44).

    python -m bench.soak [--minutes M] [--seed S] [--agents N] [--rate R]
                         [--faults KIND,...] [--actions KIND=W,...] [--server-logs DIR]

The runner (bench/runner.py) starts a PostgreSQL of the run's own on 127.0.0.1:5444 (so
that it can be restarted; fixtures/private_postgres.py), a cluster in it and three real
servers on 127.0.0.44, .45 and .46; then N real agents (bench/soak_fleet.py). For M
minutes, from seed S:

- the workload (bench/soak_workload.py; sent by bench/soak_send.py) sends jobs of every
  kind through the management API of the three servers in turn (single, retried, --all,
  rolling batches with --max-failures, timeouts, cancels, --on-lost move|wait|fail,
  secrets, limits, and a schedule every minute); operators (bench/soak_operators.py)
  block and unblock nodes (each block probed from its node: its status.json polled until
  the node says it is blocked), purge a node and join a new agent in its place, add and
  remove people; every command runs under the ledger's wrapper (bench/soak_ledger.py);
- the fault schedule (bench/soak_faults.py; injected by bench/soak_inject.py), printed on
  stderr and in the document before anything runs, injects at most one control-plane and
  one node fault at a time;
- the servers' and agents' RSS and the cluster's database connections are sampled, and
  every server exit is recorded, planned by a fault or not (bench/soak_watch.py).

Then the workload stops (the schedule is deleted), every job is waited for until it has
ended or its bound passed, and the checker (bench/soak_check.py) compares the ledger with
the store's jobs, attempts, output and audit rows (gathered by bench/soak_records.py).
The document's `violations` (each with the seed and the minute) and `faults` (counts by
kind) are among its figures (the others: bench/soak_summary.py); a run with a violation
exits 1 (`failed` names the first).
"""

from __future__ import annotations

import argparse
import json
import time

import trio

from bench.runner import Bench, Scenario, log, wait_until_servers
from bench.soak_check import check
from bench.soak_faults import KINDS, plan
from bench.soak_fleet import Fleet
from bench.soak_inject import faults
from bench.soak_ledger import ledger
from bench.soak_records import drain, records
from bench.soak_send import workload
from bench.soak_sessions import read_back
from bench.soak_state import ADDRESSES, POSTGRES_PORT, Failed, Soak
from bench.soak_summary import summary
from bench.soak_watch import sample, watch_exits
from bench.soak_workload import ACTIONS
from oz0.context import Context


async def run(bench: Bench) -> None:
    args = bench.args
    seconds = args.minutes * 60.0
    kinds = tuple(args.faults.split(",")) if args.faults else KINDS
    schedule = plan(args.seed, seconds, len(ADDRESSES), args.agents, kinds=kinds)
    bench.out["seed"] = args.seed
    bench.out["fault_schedule"] = [f.to_json() for f in schedule]
    log(f"seed {args.seed}; fault schedule: {json.dumps(bench.out['fault_schedule'])}")
    with ledger() as made:
        soak = Soak(bench, made, Fleet(bench))
        bench.progress = soak.progress
        if not await wait_until_servers(bench.files, len(bench.servers)):
            raise Failed("not all servers were up")
        soak.context = Context.load(bench.files.context_path)
        await trio.to_thread.run_sync(soak.fleet.start, args.agents)
        soak.started = time.time()
        soak.ends = soak.started + seconds
        bench.phase[0] = "soak"
        log(f"soak of {args.minutes} minutes with {args.agents} agents begins")
        async with trio.open_nursery() as watchers:
            watchers.start_soon(watch_exits, soak)
            watchers.start_soon(sample, soak)
            async with trio.open_nursery() as work:
                work.start_soon(workload, soak, work)
                work.start_soon(faults, soak, schedule, work)
            bench.phase[0] = "drain"
            log("workload and faults done; waiting for every job to end")
            drained = await drain(soak)
            watchers.cancel_scope.cancel()
        bench.phase[0] = "check"
        sessions = await read_back(soak)
        found = await trio.to_thread.run_sync(records, soak, sessions)
        violations = check(found)
        bench.out.update(summary(soak, found, schedule))
        bench.out["drain_s"] = round(drained, 1)
        bench.out["violations"] = [v.to_json(args.seed) for v in violations]
        log(f"{len(violations)} violations: {json.dumps(bench.out['violations'][:20])}")
        if violations:
            first = violations[0]
            raise Failed(
                f"{len(violations)} violations (seed {args.seed}); first at minute"
                f" {first.minute:.2f}: {first.kind}: {first.detail}"
            )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=60.0, help="how long faults and work run")
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--agents", type=int, default=100, help="real agents")
    parser.add_argument("--rate", type=float, default=1.0, help="workload actions a second")
    parser.add_argument(
        "--faults", default="", help=f"only these kinds, comma-separated (of {', '.join(KINDS)})"
    )
    parser.add_argument(
        "--actions",
        type=weights,
        default={},
        metavar="KIND=W,...",
        help=f"the workload's weights changed (of {', '.join(ACTIONS)})",
    )


def weights(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        kind, _, weight = item.partition("=")
        if kind not in ACTIONS or not weight.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r}: KIND=WEIGHT, KIND one of {list(ACTIONS)}")
        found[kind] = int(weight)
    return found


def check_args(args: argparse.Namespace) -> str | None:
    if args.minutes <= 0 or args.agents < 3 or args.rate <= 0:
        return "need --minutes > 0, --agents >= 3 and --rate > 0"
    unknown = set(filter(None, args.faults.split(","))) - set(KINDS)
    if unknown:
        return f"unknown fault kinds: {sorted(unknown)}"
    return None


SCENARIO = Scenario(
    "soak",
    __doc__ or "",
    arguments,
    run,
    servers=lambda _: ADDRESSES,
    check=check_args,
    measured=("oz0", "cli", "oz0_node"),
    private_postgres_port=POSTGRES_PORT,
    # Its faults stop servers; it records every exit itself (planned or not).
    watch_servers=False,
)
