"""A person removed, to refused on every surface of every server (issue 28): the API, the
web UI and Temporal, over three servers.

    python -m bench.operator_removal [--people P] [--burst K] [--interval S]
                                     [--idle-interval S] [--server-logs DIR]

The runner (bench/runner.py) starts a fresh test cluster and three real servers on
127.0.0.241, .242 and .243 (default ports); then, from this one process:

1. adds P people through .241's API as the cluster's admin (`POST /api/v1/operators`, what
   `operator add` sends): every other one a viewer, the rest operators, every third one
   scoped to tenant default; each enrolls through the real enrollment route of server
   i % 3 with cli/enroll.py (what `operator enroll` runs: the CA pinned by its hash, the
   key made here) and a web password, so each has a certificate and a web account;
2. for each person, on each of the three servers, three pollers, each measured apart:
   `api`, a kept API connection (cli.client.ApiClient) reading `GET /api/v1/cluster`
   (READ, no listing behind it); `web`, a session signed in through `POST /sign-in` reading
   `/overview` with its cookie; `temporal`, a Temporal client (temporalio) with the
   person's certificate calling DescribeNamespace of its namespace (default). A poller
   reads every --idle-interval (1 s) while its person waits, so that P x 9 pollers do not
   swamp two cores, and every --interval (10 ms) from WARM before its person's removal on;
3. removes the people one at a time (or K at once, --burst K) through .241's API as the
   admin (`DELETE /api/v1/operators/NAME`, what `operator remove` sends), each once every
   poller of the last one was refused or REFUSAL_BOUND passed. Refused: the API answers an
   error (401/403, or the connection is cut and no new one is taken); the web UI answers
   with a redirect (to sign-in) or 401/403; Temporal answers PermissionDenied or
   Unauthenticated;
4. for each removal, server and surface: from just before the request, and from its
   answer, to the first refusal the poller saw; p50/p90/p99/max per surface over all
   servers and per server, the API call's time, the servers' CPU over the removals.

A poller not refused within REFUSAL_BOUND of the answer, one refused before its person's
removal was sent (another's removal reached it) or one that never read before its
removal, fails the run; the document lists them. Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import http.client
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from bench.measure import Meter, percentiles, servers_up
from bench.runner import UP_TIMEOUT, Bench, Scenario, log
from cli import enroll
from cli.client import ApiClient, ApiError
from oz0.context import MANAGEMENT_PORT, Context
from oz0_common.temporal_tls import tls_from_files

ADDRESSES = ("127.0.0.241", "127.0.0.242", "127.0.0.243")
API_SERVER = f"{ADDRESSES[0]}:{MANAGEMENT_PORT}"
TEMPORAL_PORT = 7233
SURFACES = ("api", "web", "temporal")
TARGET_P99 = 2.0  # issue 28: removal to refused on every server
AIM_P99 = 0.2
# After this long from the removal's answer a surface still open is a failure of the run.
REFUSAL_BOUND = 5.0
# From a person's pollers turning fast to its removal: longer than the idle interval, so
# that every poller has read at least once at the fast pace before the request goes.
WARM_MARGIN = 0.3
# Every poller read once (sign-ins, Temporal connections) before the removals start.
READY_TIMEOUT = 120.0
ENROLL_TIMEOUT = 300.0
CALL_TIMEOUT = 5.0
STOP_TIMEOUT = 15.0
PASSWORD = "bench operator removal password"
API_PATH = "/api/v1/cluster"
WEB_PATH = "/overview"
NAMESPACE = "default"


@dataclass(eq=False)
class Probe:
    """One person's poller of one surface on one server, and what it saw. Written by its
    own thread (or the Temporal loop), read by the main thread: plain attributes, each
    written once or monotonically."""

    person: str
    server: str
    surface: str
    pace: tuple[float, float]  # (fast, idle) seconds between reads
    hot_since: float | None = None
    allowed_at: float | None = None  # the answer of the last read that was allowed
    refused_at: float | None = None
    refusal: str | None = None
    reads: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def interval(self) -> float:
        return self.pace[0] if self.hot_since is not None else self.pace[1]

    def allowed(self) -> None:
        self.reads += 1
        self.allowed_at = time.monotonic()

    def refused(self, why: str) -> None:
        self.reads += 1
        self.refused_at = time.monotonic()
        self.refusal = why[:120]

    def failed(self, why: str) -> None:
        self.errors[why[:80]] += 1


@dataclass(eq=False)
class Person:
    name: str
    role: str
    tenants: list[str]
    context: Context | None = None
    probes: list[Probe] = field(default_factory=list)
    requested: float | None = None
    answered: float | None = None
    error: str | None = None


def no_verify() -> ssl.SSLContext:
    """For the web UI: what is measured is the session, not the web UI's certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --- the pollers ----------------------------------------------------------------------------


def poll_api(probe: Probe, context: Context, stop: threading.Event) -> None:
    """The person's kept API connection to one server, reading until it is refused."""
    only_here = dataclasses.replace(
        context, servers=(f"{probe.server}:{MANAGEMENT_PORT}",), learned=()
    )
    client = ApiClient(only_here, learn_servers=False)
    try:
        while not stop.is_set() and probe.refused_at is None:
            try:
                client.get(API_PATH)
            except ApiError as e:
                # An error answer (401/403) or, the connection cut, no new one taken.
                probe.refused(str(e))
            else:
                probe.allowed()
            stop.wait(probe.interval)
    finally:
        client.close()


def web_sign_in(server: str, name: str) -> str:
    """A session of NAME's web account on SERVER: its cookie, `NAME=VALUE`."""
    conn = http.client.HTTPSConnection(server, MANAGEMENT_PORT, context=no_verify(), timeout=30.0)
    try:
        body = urllib.parse.urlencode({"username": name, "password": PASSWORD})
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Origin": f"https://{server}:{MANAGEMENT_PORT}",
        }
        conn.request("POST", "/sign-in", body=body, headers=headers)
        answer = conn.getresponse()
        answer.read()
        cookie = answer.getheader("Set-Cookie")
        if answer.status != 303 or cookie is None:
            raise RuntimeError(f"sign-in of {name} on {server} answered {answer.status}")
        return cookie.split(";", 1)[0]
    finally:
        conn.close()


def poll_web(probe: Probe, cookie: str, stop: threading.Event) -> None:
    """The person's signed-in session on one server, reading a page until it is refused."""
    conn: http.client.HTTPSConnection | None = None
    try:
        while not stop.is_set() and probe.refused_at is None:
            if conn is None:
                conn = http.client.HTTPSConnection(
                    probe.server, MANAGEMENT_PORT, context=no_verify(), timeout=CALL_TIMEOUT
                )
            try:
                conn.request("GET", WEB_PATH, headers={"Cookie": cookie})
                answer = conn.getresponse()
                answer.read()
            except (OSError, http.client.HTTPException) as e:
                # Not a refusal on the web UI: the next read takes a new connection.
                probe.failed(f"{type(e).__name__}: {e}")
                conn.close()
                conn = None
            else:
                if answer.status == 200:
                    probe.allowed()
                elif answer.status in (302, 303, 401, 403):
                    where = answer.getheader("Location") or ""
                    probe.refused(f"HTTP {answer.status} {where}".strip())
                else:
                    probe.failed(f"HTTP {answer.status}")
                if answer.will_close:
                    conn.close()
                    conn = None
            stop.wait(probe.interval)
    finally:
        if conn is not None:
            conn.close()


REFUSED_CODES = (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED)


async def poll_temporal(probe: Probe, context: Context, stop: threading.Event) -> None:
    """The person's Temporal client on one server, reading its namespace until refused."""
    tls = tls_from_files(context.ca_path, context.cert_path, context.key_path)
    target = f"{probe.server}:{TEMPORAL_PORT}"
    client: Client | None = None
    request = DescribeNamespaceRequest(namespace=NAMESPACE)
    while not stop.is_set() and probe.refused_at is None:
        try:
            if client is None:
                client = await asyncio.wait_for(
                    Client.connect(target, namespace=NAMESPACE, tls=tls), 30.0
                )
            await client.workflow_service.describe_namespace(
                request, retry=False, timeout=timedelta(seconds=CALL_TIMEOUT)
            )
        except RPCError as e:
            if e.status in REFUSED_CODES:
                probe.refused(f"{e.status.name}: {e.message}")
            else:
                probe.failed(f"{e.status.name if e.status else '?'}: {e.message}")
        except (TimeoutError, RuntimeError, OSError) as e:
            probe.failed(f"{type(e).__name__}: {e}")
        else:
            probe.allowed()
        await asyncio.sleep(probe.interval)


def temporal_loop(jobs: list[tuple[Probe, Context]], stop: threading.Event) -> None:
    """Every Temporal poller on one asyncio loop of its own thread (temporalio's client
    runs on asyncio; the rest of the bench is threads)."""

    async def main() -> None:
        await asyncio.gather(*(poll_temporal(probe, ctx, stop) for probe, ctx in jobs))

    asyncio.run(main())


@contextmanager
def pollers_running(people: list[Person], cookies: dict[tuple[str, str], str]) -> Iterator[None]:
    """Every person's pollers, in threads; stopped (within STOP_TIMEOUT) on the way out."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    temporal: list[tuple[Probe, Context]] = []
    for person in people:
        assert person.context is not None
        for probe in person.probes:
            args: tuple[Any, ...]
            target: Callable[..., None]
            if probe.surface == "api":
                target, args = poll_api, (probe, person.context, stop)
            elif probe.surface == "web":
                target, args = poll_web, (probe, cookies[person.name, probe.server], stop)
            else:
                temporal.append((probe, person.context))
                continue
            threads.append(threading.Thread(target=target, args=args, daemon=True))
    threads.append(threading.Thread(target=temporal_loop, args=(temporal, stop), daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = sum(thread.is_alive() for thread in threads)
        if left:
            log(f"{left} poller threads still running after {STOP_TIMEOUT} s (daemons)")


# --- people ---------------------------------------------------------------------------------


def wait_for_servers(bench: Bench) -> None:
    deadline = time.monotonic() + UP_TIMEOUT
    while time.monotonic() < deadline:
        ages = servers_up(bench.files)
        if sum(age < 5.0 for age in ages.values()) >= len(bench.servers):
            return
        time.sleep(0.2)
    raise RuntimeError(f"not all {len(bench.servers)} servers were up within {UP_TIMEOUT} s")


def admin_client(bench: Bench) -> ApiClient:
    """The cluster's admin (`server init`'s context), talking to .241 only."""
    context = Context.load(bench.files.context_path)
    return ApiClient(
        dataclasses.replace(context, servers=(API_SERVER,), learned=()), learn_servers=False
    )


def people_of(args: argparse.Namespace) -> list[Person]:
    people = []
    for i in range(args.people):
        role = "viewer" if i % 2 else "operator"
        tenants = ["default"] if i % 3 == 0 else []
        person = Person(f"person-{i:03d}", role, tenants)
        pace = (args.interval, args.idle_interval)
        person.probes = [
            Probe(person.name, server, surface, pace)
            for server in ADDRESSES
            for surface in SURFACES
        ]
        people.append(person)
    return people


def add_and_enroll(bench: Bench, admin: ApiClient, people: list[Person]) -> None:
    """Each person added through the API and enrolled as `operator enroll` does, through
    server i % 3; the key is made here."""
    pinned = {s: enroll.pin(f"{s}:{MANAGEMENT_PORT}", bench.files.ca_hash) for s in ADDRESSES}
    codes = {}
    for person in people:
        body = {"name": person.name, "role": person.role, "tenants": person.tenants}
        added = admin.post("/api/v1/operators", {**body, "expires": "1h"})
        codes[person.name] = str(added["code"])

    def one(index: int, person: Person) -> None:
        where = pinned[ADDRESSES[index % len(ADDRESSES)]]
        directory = bench.root / "people" / person.name
        done = enroll.enroll(where, codes[person.name], PASSWORD, directory)
        person.context = done.context

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i, p) for i, p in enumerate(people)]
        for future in futures:
            future.result(timeout=ENROLL_TIMEOUT)


def sign_in_everyone(people: list[Person]) -> dict[tuple[str, str], str]:
    """A web session of every person on every server, one sign-in after the other: the
    web UI counts a sign-in in flight as a failure of its source address until its
    password is checked (so that tries made at once cannot all pass the limit), and this
    process is one source."""
    return {(p.name, s): web_sign_in(s, p.name) for p in people for s in ADDRESSES}


def wait_until(done: Callable[[], bool], within: float, every: float = 0.005) -> bool:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


# --- removals -------------------------------------------------------------------------------


def remove_group(admin: ApiClient, group: list[Person], idle_interval: float) -> None:
    """Turn the group's pollers fast, then remove its people at once; wait (at most
    REFUSAL_BOUND after the last answer) until every poller of theirs was refused."""
    hot = time.monotonic()
    probes = [probe for person in group for probe in person.probes]
    for probe in probes:
        probe.hot_since = hot
    time.sleep(idle_interval + WARM_MARGIN)

    def remove(person: Person) -> None:
        person.requested = time.monotonic()
        try:
            admin.request("DELETE", f"/api/v1/operators/{person.name}")
        except Exception as e:
            person.error = f"{type(e).__name__}: {e}"[:200]
        person.answered = time.monotonic()

    if len(group) == 1:
        remove(group[0])
    else:
        with ThreadPoolExecutor(len(group)) as pool:
            list(pool.map(remove, group))
    wait_until(lambda: all(p.refused_at is not None for p in probes), REFUSAL_BOUND, 0.01)


def summary(people: list[Person]) -> dict[str, Any]:
    """Per surface, over all servers and per server: request and answer to refused."""
    removed = [p for p in people if p.requested is not None and p.error is None]
    out: dict[str, Any] = {}
    for surface in SURFACES:
        section: dict[str, Any] = {}
        for where in ("all", *ADDRESSES):
            from_request, from_answer = [], []
            for person in removed:
                assert person.requested is not None and person.answered is not None
                for probe in person.probes:
                    if probe.surface != surface or where not in ("all", probe.server):
                        continue
                    if probe.refused_at is not None and probe.refused_at >= person.requested:
                        from_request.append(probe.refused_at - person.requested)
                        from_answer.append(probe.refused_at - person.answered)
            section[where] = {
                "n": len(from_request),
                "request_to_refused_ms": percentiles(from_request),
                "answer_to_refused_ms": percentiles(from_answer),
            }
        # What each refusal said, its person's name taken out so that they group.
        refusals = Counter(
            (probe.refusal or "").replace(person.name, "NAME")[:70]
            for person in removed
            for probe in person.probes
            if probe.surface == surface and probe.refusal
        )
        section["refusals"] = dict(refusals.most_common(5))
        out[surface] = section
    return out


def problems(people: list[Person]) -> dict[str, list[str]]:
    """What fails the run: a removal refused, a poller never allowed before its removal,
    refused before it, or not refused within REFUSAL_BOUND of the answer."""
    found: dict[str, list[str]] = {
        "removal_failed": [],
        "not_read_before_removal": [],
        "refused_before_removal": [],
        f"not_refused_within_{REFUSAL_BOUND:g}s": [],
    }
    for person in people:
        if person.error is not None or person.requested is None:
            found["removal_failed"].append(f"{person.name}: {person.error or 'not sent'}")
            continue
        assert person.answered is not None
        for probe in person.probes:
            label = f"{person.name} {probe.surface} {probe.server}"
            hot = probe.hot_since or person.requested
            if probe.allowed_at is None or probe.allowed_at < hot:
                found["not_read_before_removal"].append(label)
            if probe.refused_at is None:
                found[f"not_refused_within_{REFUSAL_BOUND:g}s"].append(label)
            elif probe.refused_at < person.requested:
                found["refused_before_removal"].append(f"{label}: {probe.refusal}")
            elif probe.refused_at - person.answered > REFUSAL_BOUND:
                found[f"not_refused_within_{REFUSAL_BOUND:g}s"].append(label)
    return {k: v for k, v in found.items() if v}


def run(bench: Bench) -> None:
    args = bench.args
    out = bench.out
    out["api_server"] = API_SERVER
    bench.phase[0] = "servers up"
    wait_for_servers(bench)
    admin = admin_client(bench)
    people = people_of(args)
    bench.progress = lambda: {
        "removed": sum(p.requested is not None for p in people),
        "problems": problems([p for p in people if p.requested is not None]),
    }

    bench.phase[0] = "enroll"
    began = time.monotonic()
    add_and_enroll(bench, admin, people)
    out["add_and_enroll_s"] = round(time.monotonic() - began, 1)
    log(f"{len(people)} people added and enrolled in {out['add_and_enroll_s']} s")
    began = time.monotonic()
    cookies = sign_in_everyone(people)
    out["web_sign_ins_s"] = round(time.monotonic() - began, 1)

    probes = [probe for person in people for probe in person.probes]
    with pollers_running(people, cookies):
        bench.phase[0] = "pollers ready"
        began = time.monotonic()
        if not wait_until(lambda: all(p.allowed_at is not None for p in probes), READY_TIMEOUT):
            waiting = [f"{p.person} {p.surface} {p.server}" for p in probes if p.allowed_at is None]
            errors = Counter(e for p in probes for e in p.errors.elements())
            raise RuntimeError(
                f"{len(waiting)} pollers never read within {READY_TIMEOUT} s: {waiting[:6]}; "
                f"errors {dict(errors.most_common(3))}"
            )
        out["pollers"] = len(probes)
        out["pollers_ready_s"] = round(time.monotonic() - began, 1)
        log(f"{len(probes)} pollers reading in {out['pollers_ready_s']} s; removing")

        bench.phase[0] = "removals"
        meter = Meter(bench.servers)
        meter.start()
        for start in range(0, len(people), args.burst):
            group = people[start : start + args.burst]
            remove_group(admin, group, args.idle_interval)
            slowest = max(
                ((p.refused_at or float("inf")) - (person.requested or 0.0))
                for person in group
                for p in person.probes
            )
            log(f"removed {', '.join(p.name for p in group)}: slowest refusal {slowest:.3f} s")
        # The servers' CPU and RSS over the removals (no Trio loop here: no loop lag).
        metered = meter.stop()
        metered.pop("generator_loop_lag_ms", None)
        out["removals_meter"] = metered
        bench.phase[0] = "stop pollers"

    calls = [p.answered - p.requested for p in people if p.requested and p.answered]
    out["removal_api_call_ms"] = percentiles(calls)
    out["percentiles"] = summary(people)
    worst = {
        surface: out["percentiles"][surface]["all"]["request_to_refused_ms"]["p99"]
        for surface in SURFACES
    }
    out["targets"] = {
        "p99_ms_per_surface": worst,
        f"under_{TARGET_P99 * 1000:g}ms": all(
            v is not None and v < TARGET_P99 * 1000 for v in worst.values()
        ),
        f"under_{AIM_P99 * 1000:g}ms": all(
            v is not None and v < AIM_P99 * 1000 for v in worst.values()
        ),
    }
    errors = Counter(e for p in probes for e in p.errors.elements())
    out["poller_errors"] = dict(errors.most_common(10))
    out["poller_reads"] = sum(p.reads for p in probes)
    found = problems(people)
    out["problems"] = found
    bench.phase[0] = "done"
    if found:
        raise RuntimeError("; ".join(f"{k}: {len(v)} (first {v[0]})" for k, v in found.items()))


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--people", type=int, default=20, help="people added, then removed")
    parser.add_argument("--burst", type=int, default=1, help="people removed at once")
    parser.add_argument(
        "--interval", type=float, default=0.01, help="seconds between reads around a removal"
    )
    parser.add_argument(
        "--idle-interval", type=float, default=1.0, help="seconds between reads otherwise"
    )


def check(args: argparse.Namespace) -> str | None:
    if args.people < 1 or args.burst < 1:
        return "--people and --burst: 1 or more"
    if not 0 < args.interval <= args.idle_interval <= 5:
        return "--interval and --idle-interval: 0 < interval <= idle-interval <= 5"
    return None


SCENARIO = Scenario(
    "operator_removal",
    __doc__ or "",
    arguments,
    run_blocking=run,
    servers=lambda _: ADDRESSES,
    check=check,
)
