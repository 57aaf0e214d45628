"""A short soak in the suite (issue 44): `python -m bench.soak` for 3 minutes with a fixed
seed, 3 servers (127.0.0.44, 127.0.0.45, 127.0.0.46; its PostgreSQL of its own on port
5444) and 8 real agents, faults from its schedule and the workload's every kind; any
violation the checker finds (bench/soak_check.py) fails the suite, with the seed and the
minute to replay it. The checker's kinds are tested one by one in test_soak_check.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fixtures.cluster import REPO
from fixtures.private_postgres import available

SEED = 4455  # its schedule holds 9 of the 10 kinds of fault (all but a drain) in 3 minutes
MINUTES = 3
AGENTS = 8

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="needs Debian's PostgreSQL binaries"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the soak mounts a tmpfs and runs agents as root"),
]


@pytest.mark.timeout(900)
def test_a_short_soak_finds_no_violation() -> None:
    command = [
        sys.executable, "-m", "bench.soak", "--minutes", str(MINUTES), "--seed", str(SEED),
        "--agents", str(AGENTS), "--rate", "0.5",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=840,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"no report (exit {done.returncode}):\n{done.stderr[-4000:]}")
    violations = report.get("violations")
    assert violations == [], json.dumps(violations, indent=1) + "\n" + report.get("failed", "")
    assert "failed" not in report, f"{report['failed']}\n{done.stderr[-4000:]}"
    assert done.returncode == 0
    # It did what it is for: faults injected, commands run and checked.
    assert sum(report["faults"].values()) >= 3, report["faults"]
    assert report["ledger_runs"] >= 20, report["ledger_runs"]
    # Files pushed and read back from the nodes' disks, sessions opened and read back.
    assert report["pushes"]["checked"] >= 1, report["pushes"]
    assert report["sessions"]["opened"] >= 1, report["sessions"]
