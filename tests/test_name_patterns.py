"""Every name and label check matches the whole text: `^...$` with `re.match` also takes a
name followed by a newline (`$` matches before a trailing one), which would then land in
the database, the audit log and the names of Temporal namespaces. Pure: nothing is started."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from oz0 import cluster_init, node_rules, operators, tenants, token_rules
from oz0.errors import Oz0Error
from oz0.jobs.spec import JobSpec
from oz0_node.jobs.attempt import AttemptSpec


def job(**fields: object) -> None:
    JobSpec.from_json({"tenant": "default", "command": ["true"], **fields})


def parsed_attempt(job_id: str) -> None:
    AttemptSpec.parse({"job_id": job_id, "attempt": 1, "command": ["true"]})


# Each check, and a name it takes.
CHECKS: dict[str, tuple[Callable[[str], object], str]] = {
    "operator name": (operators.check_name, "alice"),
    "tenant name": (tenants.check_name, "acme"),
    "cluster name": (cluster_init.check_cluster_name, "prod"),
    "node ID": (node_rules.check_node_id, "node-0123456789ab"),
    "node label key": (lambda key: node_rules.check_labels({key: "web"}), "role"),
    "token label key": (lambda key: token_rules.check_labels({key: "web"}), "role"),
    "job selector key": (lambda key: job(selector={key: "web"}), "role"),
    "job environment variable name": (lambda name: job(env={name: "1"}), "LEVEL"),
    "job node": (lambda node: job(node=node), "node-0123456789ab"),
    "attempt's job ID (on the node)": (parsed_attempt, "job-0123456789ab"),
}


@pytest.mark.parametrize("what", sorted(CHECKS))
def test_a_name_followed_by_a_newline_is_refused(what: str) -> None:
    check, good = CHECKS[what]
    check(good)  # the name itself is fine
    for bad in (good + "\n", good + "\r\n", "\n" + good):
        with pytest.raises((Oz0Error, ApplicationError)):
            check(bad)


def test_no_pattern_is_matched_at_the_start_only() -> None:
    """`.match(` anywhere in the code is a check that a trailing newline passes (or one
    waiting to become one): every check says `fullmatch`."""
    root = Path(__file__).resolve().parent.parent
    found = [
        f"{path.relative_to(root)}:{number}"
        for package in ("oz0", "oz0_common", "oz0_node", "cli")
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ".match(" in line
    ]
    assert found == [], found
