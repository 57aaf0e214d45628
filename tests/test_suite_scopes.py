"""The suite's scheduler keeps files naming one same loopback address in one scope, and
hands out the longest scope first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import UNKNOWN_PER_TEST, address_scopes, scope_cost


def test_files_sharing_an_address_directly_or_through_another_share_a_scope() -> None:
    ip = "127.0.0."
    scopes = address_scopes(
        {
            "tests/test_c.py": f"SERVER = '{ip}31'",
            "tests/test_a.py": f"A, B = '{ip}30', '{ip}40'",
            "tests/test_b.py": f"'{ip}40:7443' and the database on {ip}1:5432",
            "tests/test_d.py": f"the database on {ip}1:5432, a server on {ip}50",
            "tests/test_e.py": f"'{ip}31:8443'",
            "tests/test_f.py": "no address at all",
        }
    )
    assert scopes == {
        "tests/test_a.py": "tests/test_a.py",
        "tests/test_b.py": "tests/test_a.py",
        "tests/test_c.py": "tests/test_c.py",
        "tests/test_d.py": "tests/test_d.py",
        "tests/test_e.py": "tests/test_c.py",
        "tests/test_f.py": "tests/test_f.py",
    }


def test_a_longer_address_is_not_taken_for_its_prefix() -> None:
    ip = "127.0.0."
    scopes = address_scopes({"tests/test_a.py": f"{ip}11", "tests/test_b.py": f"{ip}111"})
    assert scopes["tests/test_b.py"] == "tests/test_b.py"


def test_a_scope_costs_its_files_stored_seconds_and_a_guess_for_a_file_not_stored() -> None:
    nodeids = ["tests/test_a.py::one", "tests/test_a.py::two", "tests/test_new.py::one"]
    assert scope_cost(nodeids, {"tests/test_a.py": 30.0}) == 30.0 + UNKNOWN_PER_TEST


class _Worker:
    """What the scheduler asks of an xdist worker here: to run some tests, by index."""

    shutting_down = False

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)


def test_the_scheduler_hands_out_the_longest_scope_first(
    pytestconfig: pytest.Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = tmp_path / "durations.json"
    stored.write_text(json.dumps({"tests/test_a.py": 5.0, "tests/test_b.py": 60.0}))
    monkeypatch.setattr(conftest, "DURATIONS", stored)
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])  # as `-n 2` sets it
    scheduler = conftest.pytest_xdist_make_scheduler(pytestconfig, None)
    worker = _Worker()
    # In the order of their number of tests, as xdist would queue them.
    nodeids = ["tests/test_a.py::one", "tests/test_a.py::two", "tests/test_b.py::one"]
    nodeids.append("tests/test_new.py::one")
    scheduler.registered_collections[worker] = nodeids
    for nodeid in nodeids:
        scheduler.workqueue.setdefault(scheduler._split_scope(nodeid), {})[nodeid] = False
    for _ in nodeids[1:]:
        scheduler._assign_work_unit(worker)
    # test_b (60 s), test_a (5 s), then the new file (one test: UNKNOWN_PER_TEST).
    assert worker.sent == [[2], [0, 1], [3]]
