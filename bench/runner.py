"""The benchmarks' runner: it owns what every benchmark needs around its measurements.

    python -m bench SCENARIO [options]      (or python -m bench.SCENARIO [options])

A scenario (bench/scenarios/NAME.py, one object SCENARIO) says which options it takes,
which servers it wants and what it measures; the runner parses the options (adding
`--server-logs DIR`), makes a temporary directory, a fresh database (the suite's
PostgreSQL, see fixtures/postgres.py, or a private PostgreSQL the scenario may restart),
initialises a cluster in it and starts the servers (fixtures/cluster.py), runs the
scenario under a watch for signals (SIGTERM, SIGHUP) and for a server that exits, then
stops the scenario's own processes and the servers and drops the databases whatever
happened. It prints one JSON document on stdout: what ran, where and at which commit,
the scenario's figures, and each server's log summarised; a run that failed says why in
`failed`, with the tail of every server's log, and exits 1. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import platform
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
import trio

from bench.measure import server_log, servers_up
from fixtures.cluster import ClusterFiles, ServerProcess, initialise
from fixtures.edge_client import error_name
from fixtures.job_user import ensure_job_user
from fixtures.postgres import fresh_database_url
from fixtures.private_postgres import PrivatePostgres, private_postgres
from oz0 import audit, tokens
from oz0.store.dburl import DatabaseUrl
from oz0_common.addresses import EDGE_PORT
from oz0_node.jobs.job_user import DEFAULT_JOB_USER

# Every scenario, by the name `python -m bench NAME` takes.
SCENARIOS = (
    "agent_file",
    "api_cost",
    "api_fuzz",
    "block_burst",
    "dashboard_picture",
    "database_restart",
    "edge_load",
    "fanout_scale",
    "file_push_side_by_side",
    "fleet_scale",
    "idle_streams",
    "jobs",
    "listings",
    "node_removal",
    "operator_removal",
    "outlive",
    "salt_side_by_side",
    "schedule_cron",
    "sessions",
    "silent_strangers",
    "soak",
    "temporal_host",
    "web_live",
)
SERVER_START_TIMEOUT = 180.0
UP_TIMEOUT = 60.0
POLL = 0.01
LOG_TAIL_LINES = 40
# The name progress lines carry: the scenario that runs.
_program = Path(sys.argv[0]).stem


def log(message: str) -> None:
    """Progress on stderr, named after the scenario that runs."""
    print(f"[{_program} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "openssl": ssl.OPENSSL_VERSION,
        "load_average_at_start": os.getloadavg(),
    }


def source_version(measured: Sequence[str] = ("oz0", "cli")) -> str:
    """The commit this checkout is at, and whether the code measured (the directories
    MEASURED) had uncommitted changes, and in which files."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.rstrip("\n") if done.returncode == 0 else "?"

    commit = git("rev-parse", "--short", "HEAD").strip()
    if commit == "?":
        return "? (not a git checkout)"
    # Porcelain lines are "XY PATH": two status letters (either may be a space), a space.
    dirty = [line[3:] for line in git("status", "--porcelain", "--", *measured).splitlines()]
    return commit + (f" with uncommitted changes in {', '.join(dirty)}" if dirty else "")


def failure_text(e: BaseException) -> str:
    """One line for a run that failed: the first error inside any exception group."""
    inner = e
    while isinstance(inner, BaseExceptionGroup):
        inner = inner.exceptions[0]
    return f"{error_name(e)}: {inner}"[:2000]


class ServerExited(Exception):
    pass


class Terminated(Exception):
    """SIGTERM or SIGHUP: stop, but still stop the servers and drop the databases."""


def _on_terminate_signal(signum: int, _frame: object) -> None:
    raise Terminated(f"received {signal.Signals(signum).name}")


async def _watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            raise Terminated(f"received {signal.Signals(signum).name}")


async def _watch_server(server: ServerProcess, phase: list[str]) -> None:
    """End the run as soon as a server exits: there is nothing left to measure."""
    assert server.process is not None
    while True:
        await trio.sleep(0.5)
        code = server.process.poll()
        if code is not None:
            when = time.strftime("%H:%M:%S")
            raise ServerExited(f"server exited with code {code} at {when} during {phase[0]}")


# --- what scenarios share ------------------------------------------------------------------


def create_token(files: ClusterFiles, description: str) -> str:
    """A join token for tenant default, unlimited uses, no expiry, made as an operator."""
    with (
        psycopg.connect(files.main_db, autocommit=True) as conn,
        conn.transaction(),
    ):
        _, token = tokens.create(
            conn,
            tenant="default",
            ttl=None,
            max_uses=0,
            labels={},
            description=description,
            actor=audit.Actor("operator", "bench"),
        )
    return token


async def wait_until(done: Callable[[], bool], within: float) -> bool:
    """Whether DONE() came true within WITHIN seconds. It polls: what it waits for is
    written by other tasks or processes, which take the time stamps themselves."""
    with trio.move_on_after(within):
        while True:
            if done():
                return True
            await trio.sleep(POLL)
    return False


async def wait_until_servers(files: ClusterFiles, count: int) -> bool:
    """Whether COUNT servers heartbeat in the membership table within UP_TIMEOUT."""

    async def up() -> int:
        ages = await trio.to_thread.run_sync(servers_up, files)
        return sum(age < 5.0 for age in ages.values())

    with trio.move_on_after(UP_TIMEOUT):
        while True:
            if await up() >= count:
                return True
            await trio.sleep(0.2)
    return False


# --- scenarios and the envelope ------------------------------------------------------------


@dataclass(eq=False)
class Bench:
    """What a scenario runs in: its options, its cluster and servers (started, by address,
    in the order asked for), and OUT, the JSON document it adds its figures to."""

    scenario: Scenario
    args: argparse.Namespace
    root: Path
    url: DatabaseUrl
    files: ClusterFiles
    out: dict[str, Any]
    servers: dict[str, ServerProcess] = field(default_factory=dict)
    # The private PostgreSQL, for a scenario that asked for one.
    postgres: PrivatePostgres | None = None
    # What runs now, named in the failure if a server exits meanwhile.
    phase: list[str] = field(default_factory=lambda: ["setup"])
    # The scenario's own clean-ups (agents, helper processes), run before the servers stop.
    cleanups: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    # A scenario's view of its progress, added to the document if the run fails.
    progress: Callable[[], dict[str, Any]] | None = None

    @property
    def server(self) -> ServerProcess:
        """The first server (the only one, for most scenarios)."""
        return next(iter(self.servers.values()))

    @property
    def edges(self) -> list[str]:
        """The servers' edges, HOST:PORT, in the order of the servers."""
        return [f"{address}:{EDGE_PORT}" for address in self.servers]


@dataclass(frozen=True)
class Scenario:
    """One benchmark: its name, its description (the module's docstring), the options it
    takes, the servers it wants, and what it measures: RUN under Trio or, for a scenario
    that calls blocking clients only, RUN_BLOCKING in this thread."""

    name: str
    doc: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Bench], Awaitable[None]] | None = None
    run_blocking: Callable[[Bench], None] | None = None
    # The loopback addresses of the servers to start, from the options.
    servers: Callable[[argparse.Namespace], Sequence[str]] = lambda _: ()
    # What is wrong with the options, or None.
    check: Callable[[argparse.Namespace], str | None] = lambda _: None
    # Before the servers start (the environment they inherit).
    before_servers: Callable[[Bench], None] | None = None
    # The directories whose uncommitted changes the document names.
    measured: tuple[str, ...] = ("oz0", "cli")
    # A PostgreSQL of the scenario's own on this port instead of the suite's.
    private_postgres_port: int | None = None
    # Whether a server that exits ends the run.
    watch_servers: bool = True

    def __post_init__(self) -> None:
        if (self.run is None) == (self.run_blocking is None):
            raise TypeError(f"scenario {self.name}: give run or run_blocking, not both")


def scenario_named(name: str) -> Scenario:
    module = importlib.import_module(f"bench.scenarios.{name}")
    scenario = module.SCENARIO
    assert isinstance(scenario, Scenario)
    return scenario


def main(argv: Sequence[str] | None = None) -> None:
    """python -m bench SCENARIO [options]."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in SCENARIOS:
        names = ", ".join(SCENARIOS)
        sys.exit(f"usage: python -m bench SCENARIO [options]; SCENARIO is one of {names}")
    run(scenario_named(args[0]), args[1:])


def run(scenario: Scenario, argv: Sequence[str] | None = None) -> None:
    """Run SCENARIO with the options ARGV (sys.argv's by default) in the envelope."""
    global _program
    _program = scenario.name
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{scenario.name}", description=scenario.doc.split("\n\n")[0]
    )
    scenario.arguments(parser)
    parser.add_argument(
        "--server-logs", type=Path, metavar="DIR", help="keep each server's stderr in DIR"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if (problem := scenario.check(args)) is not None:
        parser.error(problem)
    # The benchmarks' agents run as root, so their jobs run as the job user: made once per
    # machine, as `oz0-node install-service` makes it (else the agents refuse to start).
    ensure_job_user(DEFAULT_JOB_USER)
    addresses = list(scenario.servers(args))
    given = sys.argv[1:] if argv is None else list(argv)
    out: dict[str, Any] = {
        "benchmark": f"bench.{scenario.name}",
        "command": " ".join([f"python -m bench.{scenario.name}", *given]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "source": source_version(scenario.measured),
        "servers": addresses,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    failure: BaseException | None = None
    bench: Bench | None = None
    signal.signal(signal.SIGTERM, _on_terminate_signal)
    signal.signal(signal.SIGHUP, _on_terminate_signal)
    try:
        with _envelope(scenario, args, addresses, out) as bench:
            if scenario.run is not None:
                trio.run(_watched, scenario.run, bench)
            elif scenario.run_blocking is not None:
                scenario.run_blocking(bench)
    except BaseException as e:
        failure = e
        out["failed"] = failure_text(e)
        if bench is not None and bench.progress is not None:
            out["progress_at_failure"] = bench.progress()
        log(f"failed: {out['failed']}")
    out["load_average_at_end"] = os.getloadavg()
    print(json.dumps(out, indent=2), flush=True)
    if failure is not None and not isinstance(failure, Exception):
        raise failure  # KeyboardInterrupt and the like: end as they would have
    if failure is not None:
        sys.exit(1)  # a run that failed is no result: what runs it must see so


@contextlib.contextmanager
def _envelope(
    scenario: Scenario, args: argparse.Namespace, addresses: list[str], out: dict[str, Any]
) -> Iterator[Bench]:
    """A cluster in a fresh database with its servers up, and everything undone after."""
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        postgres = None
        if scenario.private_postgres_port is not None:
            port = scenario.private_postgres_port
            postgres = stack.enter_context(private_postgres(port))
            with postgres.connection() as conn:
                row = conn.execute("SHOW server_version").fetchone()
            out["postgres_version"] = row[0] if row else None
            url = DatabaseUrl.parse(f"postgresql://postgres@127.0.0.1:{port}/oz0")
        else:
            url = stack.enter_context(fresh_database_url())
        advertise = addresses[0] if addresses else "127.0.0.11"
        files = initialise(root, url, "bench", advertise=advertise)
        bench = Bench(scenario, args, root, url, files, out, postgres=postgres)
        stack.push(_servers_stopped(bench))
        stack.enter_context(bench.cleanups)
        # Last in, first out: no second signal may cut the clean-ups short.
        stack.callback(_ignore_signals)
        if scenario.before_servers is not None:
            scenario.before_servers(bench)
        out["server_start_s"] = {}
        for address in addresses:
            server = ServerProcess.for_cluster(
                files, address, workdir=root / address, extra=UNCAPPED
            )
            bench.servers[address] = server
            began = time.monotonic()
            server.start(timeout=SERVER_START_TIMEOUT)
            out["server_start_s"][address] = round(time.monotonic() - began, 2)
            log(f"server up on {address} in {out['server_start_s'][address]} s (pid {server.pid})")
        yield bench


# A benchmark's one operator sends what it measures as fast as the server takes it: the
# caps that keep one person from taking a server from the others are lifted
# (oz0/server/person_limits.py), so they are not what is measured.
UNCAPPED = (
    "--person-requests-per-second", "100000", "--person-request-burst", "100000",
    "--max-live-pages-per-person", "200", "--max-web-sessions-per-person", "10000",
)  # fmt: skip


def _ignore_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _servers_stopped(
    bench: Bench,
) -> Callable[[type[BaseException] | None, BaseException | None, TracebackType | None], bool]:
    """An exit callback that stops the servers and adds what they logged to the document:
    a summary each, and after a failure the tail of each log."""

    def stop(
        _type: type[BaseException] | None, error: BaseException | None, _tb: TracebackType | None
    ) -> bool:
        logs: dict[str, Any] = {}
        bench.out["server_logs"] = logs
        for address, server in bench.servers.items():
            began = time.monotonic()
            with contextlib.suppress(Exception):
                server.kill()
            text = server.stderr()
            logs[address] = {
                "returncode": server.process.returncode if server.process else None,
                "stop_s": round(time.monotonic() - began, 2),
                "tracebacks": text.count("Traceback"),
                **server_log(text, bench.out.get("phases_utc") or [None, None]),
            }
            if error is not None:
                logs[address]["tail"] = text.splitlines()[-LOG_TAIL_LINES:]
            if bench.args.server_logs:
                bench.args.server_logs.mkdir(parents=True, exist_ok=True)
                (bench.args.server_logs / f"{address}.log").write_text(text)
        return False

    return stop


async def _watched(run: Callable[[Bench], Awaitable[None]], bench: Bench) -> None:
    """RUN, ended early by SIGTERM or SIGHUP, or by a server that exits."""
    async with trio.open_nursery() as watchdog:
        if bench.scenario.watch_servers:
            for server in bench.servers.values():
                watchdog.start_soon(_watch_server, server, bench.phase)
        watchdog.start_soon(_watch_signals)
        await run(bench)
        watchdog.cancel_scope.cancel()
