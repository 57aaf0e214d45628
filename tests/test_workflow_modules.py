"""The job workers' sandbox passes our workflow modules through (oz0/jobs/role.py,
WORKFLOW_RUNNER): the modules they import are the real ones, so the sandbox does not
refuse a call of theirs that would make a replay differ. This reads their source instead:
they import only temporalio, the standard library's deterministic parts and each other, and
call nothing of the clock, randomness or the environment directly (the workflow's own
`workflow.now()`, `workflow.sleep()`, `workflow.random()` are the way)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fixtures.syntax_trees import parsed_text

ROOT = Path(__file__).resolve().parent.parent
# The job workflow's package, every module of it, the end reasons its values carry, and
# the schedules' workflow.
MODULES = (
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "oz0/jobs/workflow").glob("*.py")),
    "oz0/jobs/end_reasons.py",
    "oz0/jobs/scheduled.py",
)
IMPORTABLE = (
    "__future__", "asyncio", "collections", "contextlib", "dataclasses", "datetime",
    "enum", "typing", "temporalio", "oz0.jobs.workflow", "oz0.jobs.end_reasons",
)  # fmt: skip
# Calls that read the clock, randomness, the environment or the machine.
REFUSED_CALLS = {
    "now", "utcnow", "today", "time", "time_ns", "monotonic", "perf_counter", "sleep",
    "random", "randint", "choice", "shuffle", "uuid1", "uuid4", "urandom", "getenv",
    "token_hex", "token_bytes", "gethostname",
}  # fmt: skip


def _problems(source: str) -> list[str]:
    found = []
    for node in ast.walk(parsed_text(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names
            ]  # fmt: skip
            for name in names:
                if not any(name == ok or name.startswith(ok + ".") for ok in IMPORTABLE):
                    found.append(f"line {node.lineno}: imports {name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if node.func.attr in REFUSED_CALLS and not (
                isinstance(owner, ast.Name) and owner.id in ("workflow", "asyncio")
            ):
                found.append(f"line {node.lineno}: calls .{node.func.attr}()")
    return found


@pytest.mark.parametrize("module", MODULES)
def test_a_passed_through_workflow_module_calls_nothing_a_replay_could_see_differ(
    module: str,
) -> None:
    assert _problems((ROOT / module).read_text(encoding="utf-8")) == []


def test_every_module_of_the_workflow_package_is_checked() -> None:
    assert {"oz0/jobs/workflow/__init__.py", "oz0/jobs/workflow/_job.py"} <= set(MODULES)


def test_the_check_finds_a_clock_read_and_a_foreign_import() -> None:
    bad = "import os\nimport datetime as dt\n\ndef f():\n    return dt.datetime.now()\n"
    assert _problems(bad) == ["line 1: imports os", "line 5: calls .now()"]
