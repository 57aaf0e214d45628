"""Test support stays shared: no test module defines a fixture or helper function that the
shared support already provides — fixtures/, tests/conftest.py, tests/web_support.py — by
its name (a fixture also by the name pytest knows it by). A copy drifts from the
original, and the next test copies the copy; use (or widen) the shared one instead.

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

# (test module, name): why that module defines its own. Each entry needs its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("test_web_live.py", "cluster_files"): (
        "overrides conftest's per-test cluster with the module's cluster of two servers, so"
        " that conftest's fixtures built on cluster_files (cluster_env) use that one"
    ),
    ("test_web_ui.py", "cluster_files"): (
        "overrides conftest's per-test cluster with the module's cluster of two servers, so"
        " that conftest's fixtures built on cluster_files (cluster_env) use that one"
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
    fixture: bool


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


def definitions(path: Path) -> Iterator[Definition]:
    """PATH's module-level functions: each under its own name, a fixture also under its
    fixture name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            fixture = _fixture_name(node)
            for name in {node.name, fixture} - {None}:
                assert name is not None
                yield Definition(path.name, node.lineno, name, fixture is not None)


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
            if d.name in shared:
                kind = "fixture" if d.fixture else "helper"
                where = ", ".join(shared[d.name])
                found.append(f"tests/{d.module}:{d.line}: {kind} {d.name} ({where} has it)")
    return found


def test_no_test_module_defines_what_the_shared_support_provides() -> None:
    modules = sorted(TESTS.glob("test_*.py"))
    assert len(modules) > 100, "the test modules are where they were"
    found = copies(modules, SUPPORT)
    assert not found, "use the shared one, or rename yours:\n" + "\n".join(found)


def test_every_allowed_entry_has_a_reason_and_is_still_needed() -> None:
    shared = provided(SUPPORT)
    for (module, name), why in ALLOWED.items():
        assert len(why.split()) >= 5, f"{module} {name}: say why"
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
