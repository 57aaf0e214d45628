"""Test support stays shared: no test module defines a fixture or helper function, or
assigns a module-level name (a type alias such as `StartServer = Callable[...]`), that the
shared support already provides — fixtures/, tests/conftest.py, tests/web_support.py — by
its name (a fixture also by the name pytest knows it by). A copy drifts from the
original, and the next test copies the copy; use (or widen) the shared one instead.
Constants (ALL_CAPS) are left alone: a file's addresses and bounds are its own.

Nor does a test module import from another test module (`from tests.test_x import ...`,
`import tests.test_x`): what two test modules need goes to the support, where the next
test finds it and where it carries no other file's address.

A test module that needs a name the support also uses for something else renames its
own, or is listed in ALLOWED with why. Reads the source only: no server, no database.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SUPPORT = [
    *sorted((ROOT / "fixtures").glob("*.py")),
    TESTS / "conftest.py",
    TESTS / "web_support.py",
]

# (test module, name): why that module defines its own (or, name a test module's
# `tests.test_x`, imports from that one). Each entry needs its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("test_web_live.py", "cluster_files"): (
        "overrides conftest's per-test cluster with the module's cluster of two servers, so"
        " that conftest's fixtures built on cluster_files (cluster_env) use that one"
    ),
    ("test_web_ui.py", "cluster_files"): (
        "overrides conftest's per-test cluster with the module's cluster of two servers, so"
        " that conftest's fixtures built on cluster_files (cluster_env) use that one"
    ),
    # conftest's net is fake edges a and b; these modules' agents talk to others.
    ("test_agent_purge.py", "net"): "overrides conftest's net with one fake edge, its EDGE",
    ("test_agent_runtime.py", "net"): "overrides conftest's net with fake edge a alone",
    ("test_node_attempt_link.py", "net"): (
        "overrides conftest's net with fake edge a alone and a fake Temporal address there"
    ),
    ("test_node_renewal.py", "net"): (
        "overrides conftest's net with fake edge a alone, its certificates valid ten minutes"
    ),
    # fixtures/job_calls.py's api is a cluster's operator ApiClient; these are other things.
    ("test_http_surfaces.py", "api"): (
        "its api is one request by curl with a chosen operator's certificate, answering the"
        " status and the JSON"
    ),
    ("test_job_cli.py", "api"): (
        "its api fixture is a recording fake the CLI's job commands talk to, no cluster"
    ),
    ("test_listings.py", "api"): (
        "its api fixture is the client of the module's served cluster, which the fixture"
        " `cluster` gives; the shared api takes the files as an argument"
    ),
    ("test_tenant_answers.py", "api"): (
        "its api builds a probe (a request of the JSON API to try as each person), sends nothing"
    ),
    ("test_tenant_scope.py", "api"): (
        "its api is one request with an environment's operator certificate, answering the"
        " status and the decoded answer"
    ),
    # fixtures/cli_runner.py's ok is a CLI result that succeeded.
    ("test_job_fanout_view.py", "ok"): (
        "its ok is an attempt row that ended with exit code 0, for the fan-out view"
    ),
    ("test_tenant_scope.py", "ok"): (
        "its ok is a request of the JSON API that succeeded (its decoded answer), not a CLI result"
    ),
    # fixtures/cluster_db.py's uses and sql read the cluster's database directly.
    ("test_label_lock.py", "uses"): (
        "its uses reads a token's uses through the JSON API as a person, not the database"
    ),
    ("test_temporal_operators.py", "sql"): (
        "its sql runs one statement in a transaction that commits, answering nothing; the"
        " shared one runs in autocommit and answers the rows"
    ),
    # fixtures/cluster.py's run_cli answers the finished process.
    ("test_web_admin.py", "run_cli"): (
        "its run_cli runs as the cluster's admin with check=True and answers the decoded JSON"
    ),
    # fixtures/enrolled_people.py's add is `operator add`.
    ("test_web_overview.py", "add"): (
        "its add inserts a node row of a tenant and state, for the overview's counts"
    ),
}


@dataclass(frozen=True)
class Definition:
    module: str
    line: int
    name: str
    kind: str  # fixture, helper, class or name (bound by an assignment)


def _fixture_name(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name pytest knows NODE by if it is a fixture (`name=` or the function's), else
    None."""
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        target = call.func if call is not None else decorator
        if ast.unparse(target) not in ("pytest.fixture", "fixture"):
            continue
        for keyword in call.keywords if call is not None else []:
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
        return node.name
    return None


def _assigned(node: ast.stmt) -> list[str]:
    """The names a module-level assignment binds (`A, B = ...` both), constants aside."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return [name for name in names if not name.isupper()]


def definitions(path: Path) -> Iterator[Definition]:
    """PATH's module-level functions (each under its own name, a fixture also under its
    fixture name), classes and names it assigns (its constants aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            fixture = _fixture_name(node)
            for name in {node.name, fixture} - {None}:
                assert name is not None
                kind = "fixture" if fixture is not None else "helper"
                yield Definition(path.name, node.lineno, name, kind)
        elif isinstance(node, ast.ClassDef):
            yield Definition(path.name, node.lineno, node.name, "class")
        for name in _assigned(node):
            yield Definition(path.name, node.lineno, name, "name")


def provided(paths: list[Path]) -> dict[str, list[str]]:
    """Each public name the support PATHS define (their pytest hooks aside): where."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for d in definitions(path):
            if not d.name.startswith(("_", "pytest_")):
                found.setdefault(d.name, []).append(f"{path.parent.name}/{path.name}")
    return found


def copies(modules: list[Path], support: list[Path]) -> list[str]:
    """What the test MODULES define that SUPPORT provides (and ALLOWED does not list)."""
    shared = provided(support)
    found = []
    for path in modules:
        for d in definitions(path):
            if d.name.startswith("test_") or (d.module, d.name) in ALLOWED:
                continue
            # A test module's classes are its own records (Answer, Fleet, Job: several share
            # a name with a support class and are other things); a support class bound
            # again by assignment, as StartServer was, is a copy.
            if d.kind == "class":
                continue
            if d.name in shared:
                where = ", ".join(shared[d.name])
                found.append(f"tests/{d.module}:{d.line}: {d.kind} {d.name} ({where} has it)")
    return found


def _test_modules_imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Each import in TREE (anywhere: a function's own too) of a test module: its line and
    the module (`tests.test_x`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            # `from .test_x import` is, from a module of tests/, `from tests.test_x import`.
            relative = ".".join(["tests", *([node.module] if node.module else [])])
            modules = [relative if node.level == 1 else node.module or ""]
            if modules == ["tests"]:  # from tests import test_x, or from . import test_x
                modules = [f"tests.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            if module.startswith("tests.test_"):
                yield node.lineno, ".".join(module.split(".")[:2])


def cross_imports(modules: list[Path]) -> list[str]:
    """Where the test MODULES import from a test module (and ALLOWED does not list)."""
    found = []
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in _test_modules_imported(tree):
            if (path.name, module) not in ALLOWED:
                found.append(f"{path.parent.name}/{path.name}:{line}: imports from {module}")
    return found


def test_no_test_module_defines_what_the_shared_support_provides() -> None:
    modules = sorted(TESTS.glob("test_*.py"))
    assert len(modules) > 100, "the test modules are where they were"
    found = copies(modules, SUPPORT)
    assert not found, "use the shared one, or rename yours:\n" + "\n".join(found)


def test_no_test_module_imports_from_another() -> None:
    modules = sorted(TESTS.glob("test_*.py"))
    assert len(modules) > 100, "the test modules are where they were"
    found = cross_imports([*modules, *SUPPORT])
    assert not found, "move what is shared to fixtures/ (or conftest):\n" + "\n".join(found)


def test_every_allowed_entry_has_a_reason_and_is_still_needed() -> None:
    shared = provided(SUPPORT)
    for (module, name), why in ALLOWED.items():
        assert len(why.split()) >= 5, f"{module} {name}: say why"
        if name.startswith("tests.test_"):
            tree = ast.parse((TESTS / module).read_text(encoding="utf-8"))
            imported = {m for _, m in _test_modules_imported(tree)}
            assert name in imported, f"{module} {name}: no longer imported"
            continue
        defined = {d.name for d in definitions(TESTS / module)}
        assert name in defined and name in shared, f"{module} {name}: no longer a copy"


@pytest.mark.parametrize(
    "source, kind",
    [
        # A fixture copied in, as ~14 modules each had their own `conn`.
        (
            "@pytest.fixture\n"
            "def conn(cluster_files):\n"
            "    with psycopg.connect(cluster_files.main_db, autocommit=True) as c:\n"
            "        yield c\n",
            "fixture conn",
        ),
        # Under another function name, known to pytest by the shared fixture's.
        (
            "@pytest.fixture(name='one_cluster')\ndef mine(tmp_path_factory):\n    pass\n",
            "one_cluster",
        ),
        # A helper, as modules wrote their own polling loop after fixtures/polling.py.
        ("def wait_until(check, within):\n    pass\n", "helper wait_until"),
        ("async def trio_until(check):\n    pass\n", "helper trio_until"),
    ],
)
def test_a_copy_of_shared_support_is_found(tmp_path: Path, source: str, kind: str) -> None:
    module = tmp_path / "test_copying.py"
    module.write_text("import pytest\n\n" + source, encoding="utf-8")
    [found] = copies([module], SUPPORT)
    assert kind in found and found.startswith("tests/test_copying.py:"), found


def test_names_of_its_own_and_the_support_s_private_ones_are_left(tmp_path: Path) -> None:
    module = tmp_path / "test_own.py"
    module.write_text(
        "def _failure():\n    pass\n\n"  # fixtures/polling.py's is private
        "def test_wait_until():\n    pass\n\n"  # a test, named for what it tests
        "def my_own_helper():\n    pass\n",
        encoding="utf-8",
    )
    assert copies([module], SUPPORT) == []


@pytest.mark.parametrize(
    "source, kind",
    [
        # The alias ~30 modules each wrote before fixtures/cluster.py's StartServer.
        (
            "from collections.abc import Callable\n"
            "from fixtures.cluster import ServerProcess\n\n"
            "StartServer = Callable[..., ServerProcess]\n",
            "name StartServer",
        ),
        # Annotated, and one of several bound at once.
        ("from typing import TypeAlias\n\nCliRunner: TypeAlias = object\n", "name CliRunner"),
        ("api, mine = None, None\n", "name api"),
    ],
)
def test_a_name_the_support_defines_assigned_again_is_found(
    tmp_path: Path, source: str, kind: str
) -> None:
    module = tmp_path / "test_aliasing.py"
    module.write_text(source, encoding="utf-8")
    [found] = copies([module], SUPPORT)
    assert kind in found and found.startswith("tests/test_aliasing.py:"), found


def test_constants_classes_and_imports_of_the_support_are_a_module_s_own(tmp_path: Path) -> None:
    module = tmp_path / "test_own_names.py"
    module.write_text(
        "from fixtures.cluster import StartServer\n"  # imported, not copied
        "from tests.conftest import CliRunner\n\n"
        "TIMEOUT = 5.0\n"  # fixtures/edge_client.py has a TIMEOUT: a file's bounds are its own
        "class Fleet:\n    pass\n",  # a record of its own, whatever edge_client's Fleet is
        encoding="utf-8",
    )
    assert copies([module], SUPPORT) == []
    assert cross_imports([module]) == []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.test_jobs_e2e import wait_job\n",
        "import tests.test_jobs_e2e\n",
        "import tests.test_jobs_e2e as jobs\n",
        "from tests import test_jobs_e2e\n",
        "from .test_jobs_e2e import wait_job\n",
        "from . import test_jobs_e2e\n",
        # Inside a function, as a late import to dodge a cycle would be.
        "def helper():\n    from tests.test_jobs_e2e import wait_job\n",
    ],
)
def test_an_import_from_a_test_module_is_found(tmp_path: Path, source: str) -> None:
    module = tmp_path / "test_importing.py"
    module.write_text(source, encoding="utf-8")
    [found] = cross_imports([module])
    assert found.endswith(": imports from tests.test_jobs_e2e"), found
    assert found.startswith(f"{tmp_path.name}/test_importing.py:"), found
