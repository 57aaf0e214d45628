from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from cli.main import run
from fixtures import one_thread, zygotes
from fixtures.agent import AgentProcess, stop_all

# Re-exported: test modules import them from here.
from fixtures.cli_runner import CliResult as CliResult
from fixtures.cli_runner import CliRunner as CliRunner
from fixtures.cli_runner import SharedEnviron
from fixtures.cluster import (
    DEFAULT_ADVERTISE,
    ClusterFiles,
    Served,
    ServerProcess,
    StartServer,
    end_all,
    serving_cluster,
)
from fixtures.cluster_copies import ClusterTemplate
from fixtures.cluster_copies import cluster_template as cluster_template_of
from fixtures.fake_edges import FakeNet, fake_net
from fixtures.job_user import ensure_job_user
from fixtures.postgres import fresh_database_url
from fixtures.web_events import EventStream
from oz0 import cluster, pki
from oz0.store.dburl import DatabaseUrl
from oz0_node.jobs.job_user import DEFAULT_JOB_USER
from oz0_node.jobs.tracking import stop_being_subreaper


def create_token(cli: CliRunner, env: dict[str, str], *extra: str, tenant: str = "default") -> str:
    """A join token made by `token create` (EXTRA: its options) as ENV's operator."""
    created = cli("token", "create", "--tenant", tenant, "--json", *extra, env=env)
    assert created.code == 0, created.err
    return str(created.json()["token"])


# Each test file keeps to loopback addresses of its own (README), so `nox -s tests` runs
# files side by side on three workers (`-n 3`). Files naming one same 127.0.0.x address (the
# default cluster's 127.0.0.11 among them) are one scope, run one test at a time; the
# rest, a scope each. 127.0.0.1 (the suite's PostgreSQL) joins nothing.
_ADDRESS = re.compile(r"\b127\.0\.0\.(\d{1,3})\b")
_SHARED_BY_ALL = frozenset({"1"})


def address_scopes(texts: dict[str, str]) -> dict[str, str]:
    """Each file's scope: the files whose addresses overlap, directly or through others,
    share the scope of the first of them (by name)."""
    parent = {file: file for file in texts}

    def root(file: str) -> str:
        while parent[file] != file:
            parent[file] = parent[parent[file]]
            file = parent[file]
        return file

    owner: dict[str, str] = {}
    for file in sorted(texts):
        for address in set(_ADDRESS.findall(texts[file])) - _SHARED_BY_ALL:
            if address in owner:
                a, b = sorted((root(owner[address]), root(file)))
                parent[b] = a
            else:
                owner[address] = file
    return {file: root(file) for file in texts}


# What each test file took (setup, call and teardown of its tests, in seconds) in the last
# whole run that stored it (`pytest -n 3 --store-durations`). The scheduler hands out the
# longest scope first: ordered by their number of tests (xdist's way), the long files of
# one or two end-to-end tests came last, and one worker waited for the other's.
DURATIONS = Path(__file__).with_name("durations.json")
# A file not stored yet (a new one) is taken to cost this much a test.
UNKNOWN_PER_TEST = 2.0


def scope_cost(nodeids: Iterable[str], durations: Mapping[str, float]) -> float:
    """What the tests NODEIDS are expected to take: their files' stored seconds, or for a
    file not stored, UNKNOWN_PER_TEST a test."""
    files = Counter(nodeid.split("::", 1)[0] for nodeid in nodeids)
    return sum(durations.get(file, n * UNKNOWN_PER_TEST) for file, n in files.items())


def stored_durations() -> dict[str, float]:
    try:
        stored: dict[str, float] = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return stored


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    tests = config.rootpath / "tests"
    scopes = address_scopes(
        {f"tests/{p.name}": p.read_text(encoding="utf-8") for p in tests.glob("test_*.py")}
    )
    durations = stored_durations()

    class ByAddresses(LoadScopeScheduling):  # type: ignore[misc]
        """One scope a test file, or one for the files sharing addresses; the longest
        first."""

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return scopes.get(file, file)

        def _assign_work_unit(self, node: Any) -> None:
            # xdist hands out the front of its queue: put the costliest scope there (with
            # no stored durations at all, its own order stays).
            if durations:
                longest = max(
                    self.workqueue, key=lambda s: scope_cost(self.workqueue[s], durations)
                )
                self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return ByAddresses(config, log)


def pytest_configure(config: pytest.Config) -> None:
    one_thread.describe(config)
    # Before collection: the modules that run jobs as this account decide at import whether
    # they can (a skip on a fresh machine, where no earlier run had made it).
    ensure_job_user(DEFAULT_JOB_USER)
    # Servers and agents forked from processes that imported them once (fixtures/zygotes.py).
    zygotes.enable()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    return one_thread.run_alone(pyfuncitem)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help="after a whole run, write what each test file took to tests/durations.json",
    )


_took: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _took[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Only the process that saw every report: xdist's controller, or a run without it.
    if not session.config.getoption("store_durations") or hasattr(session.config, "workerinput"):
        return
    durations = stored_durations() | {file: round(took, 1) for file, took in _took.items()}
    kept = {f: d for f, d in sorted(durations.items()) if (session.config.rootpath / f).is_file()}
    DURATIONS.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")


@pytest.fixture
def pg_url() -> Iterator[DatabaseUrl]:
    with fresh_database_url() as url:
        yield url


@pytest.fixture(scope="session")
def cluster_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTemplate]:
    with cluster_template_of(tmp_path_factory.mktemp("cluster-template")) as template:
        yield template


@pytest.fixture
def cluster_files(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    pg_url: DatabaseUrl,
    cluster_template: ClusterTemplate,
) -> ClusterFiles:
    """A cluster of its own in the test's databases, as `server init` leaves it (a copy of
    this process's one: fixtures/cluster_copies.py). Its context names the API at the test
    module's `ADVERTISE` address where the module sets one (its own server: the README's
    table), else at the default cluster's 127.0.0.11; in a module whose tests mostly share
    one server (`served`, on ADVERTISE all along), at its `OWN_CLUSTER_ADVERTISE`, where the
    few tests that need a server of their own start it."""
    module = request.module
    advertise = getattr(
        module, "OWN_CLUSTER_ADVERTISE", getattr(module, "ADVERTISE", DEFAULT_ADVERTISE)
    )
    return cluster_template.copy(tmp_path, pg_url, advertise=advertise)


@pytest.fixture(scope="module")
def one_cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cluster_template: ClusterTemplate,
) -> Iterator[ClusterFiles]:
    """One cluster for the whole module in databases of its own, no server running: a copy
    of this process's one `server init` (fixtures/cluster_copies.py), its context naming the
    module's `ADVERTISE` if it has one."""
    name = request.module.__name__.rpartition(".")[2]
    advertise = getattr(request.module, "ADVERTISE", DEFAULT_ADVERTISE)
    with fresh_database_url() as url:
        yield cluster_template.copy(tmp_path_factory.mktemp(name), url, advertise=advertise)


@pytest.fixture
def conn(request: pytest.FixtureRequest) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection (each statement a transaction of its own, as the servers'
    are) to the cluster's own database, after the module's `CLEAN` statements (its clean
    start; fixtures/job_rows.py has the jobs' one). The cluster is the module's
    `one_cluster`, unless its `CONN_CLUSTER` names the fixture that gives another:
    "cluster_files" (the test's own) or "served" (the module's server's)."""
    module = request.module
    found = request.getfixturevalue(getattr(module, "CONN_CLUSTER", "one_cluster"))
    files: ClusterFiles = found.files if isinstance(found, Served) else found
    with psycopg.connect(files.main_db, autocommit=True) as c:
        for statement in getattr(module, "CLEAN", ()):
            c.execute(statement)
        yield c


@pytest.fixture(scope="session")
def served_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTemplate]:
    """The `server init` the modules' shared servers (`served`) are copied from: another
    than `cluster_template`'s, so that a module's `served` and its tests' own clusters have
    CAs of their own, as before."""
    with cluster_template_of(tmp_path_factory.mktemp("served-template")) as template:
        yield template


@pytest.fixture(scope="module")
def served(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    served_template: ClusterTemplate,
) -> Iterator[Served]:
    """One cluster and one server for the whole module (a server start costs seconds), at
    the module's `ADVERTISE` address, started with its `SERVER_ARGS` if it has any. The
    cluster is a copy of this process's `served_template` (fixtures/cluster_copies.py: a
    `server init` of its own took about 1 CPU-s, most of it PostgreSQL's, a copy 0.2-0.5)."""
    module = request.module
    root = tmp_path_factory.mktemp(module.__name__.rpartition(".")[2])
    with fresh_database_url() as url:
        files = served_template.copy(root, url, advertise=module.ADVERTISE)
        extra = getattr(module, "SERVER_ARGS", ())
        with serving_cluster(files, root, module.ADVERTISE, extra) as one:
            yield one


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> CliRunner:
    """Run `orchestrator-zero ARGS` in this process with ENV set; capture its output."""
    environ = SharedEnviron()

    def invoke(*args: str, env: dict[str, str] | None = None) -> CliResult:
        wanted: dict[str, str | None] = {
            "OZ0_CONTEXT": None,
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            **(env or {}),
        }
        with environ.applied(wanted):
            capsys.readouterr()
            code = run(list(args))
            out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return invoke


@pytest.fixture
def ca(conn: psycopg.Connection[Any], cluster_files: ClusterFiles) -> pki.CertificateAuthority:
    """The test cluster's CA, unsealed with the test's copy of the master key."""
    return cluster.load(conn, pki.read_master_key(cluster_files.master_key)).cluster_ca


@pytest.fixture
def cluster_env(cluster_files: ClusterFiles) -> dict[str, str]:
    return cluster_files.cli_env


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    started: list[ServerProcess] = []

    def start(files: ClusterFiles, address: str, *extra: str) -> ServerProcess:
        server = ServerProcess.for_cluster(
            files, address, workdir=tmp_path / f"server-{address}", extra=extra
        )
        started.append(server)
        return server.start()

    yield start
    end_all(started)


@pytest.fixture
async def net(nursery: trio.Nursery) -> FakeNet:
    """Fake edges a and b, for an agent's tests (a module with other edges overrides it)."""
    return fake_net(nursery, "edge-a:7443", "edge-b:7443")


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """Real agents a test starts (append them); stopped at its end."""
    started: list[AgentProcess] = []
    yield started
    stop_all(started)


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """PIDs a test's commands printed (append them): whatever a failing test left is
    killed after it, its process group too."""
    found: list[int] = []
    yield found
    for pid in found:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


@pytest.fixture
def streams() -> Iterator[list[EventStream]]:
    """The web UI's live streams a test opens (append each), closed after it."""
    opened: list[EventStream] = []
    yield opened
    for stream in opened:
        stream.close()


@pytest.fixture(autouse=True)
def not_a_subreaper_after() -> Iterator[None]:
    """A test that forced the subreaper tracking made this process a child subreaper: undo
    it after the test, or every orphan of later tests' servers and agents would come to
    this process and stay a zombie (it never reaps them)."""
    yield
    stop_being_subreaper()


@pytest.fixture(scope="session")
def job_user() -> str:
    """The account `oz0-job` (made before collection: `pytest_configure`), for the tests
    that run jobs as a named account (`--job-user`) and for the previous release's agents
    (tests/test_rolling_upgrade.py), which needed it as root; this release's agents give
    each attempt a UID of its own."""
    return DEFAULT_JOB_USER
