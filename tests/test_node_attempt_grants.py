"""The grant an attempt comes with: the node runs only what the cluster signed, for this
node, now, once (its run record), through the real hand-over and attempt manager with a
fake edge (fixtures/node_attempts.py).

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from fixtures.attempt_grants import signed
from fixtures.node_attempts import (
    CLUSTER_CA,
    JOB,
    NODE_ID,
    RecordingEdge,
    handed,
    run_attempt,
    sign,
    spec,
    unsigned,
)
from oz0 import pki
from oz0_node.jobs import supervisor_client
from oz0_node.jobs.grants import CLOCK_SKEW, AttemptRefused, GrantCheck, RunRecord

# --- the grant: only what the cluster signed, for this node, now, once -------------------


def refused(raw: dict[str, Any], data_dir: Path) -> tuple[ApplicationError, RecordingEdge]:
    edge = RecordingEdge()
    with pytest.raises(ApplicationError) as raised:
        handed(raw, data_dir, edge)
    assert raised.value.type == "AttemptRefused" and raised.value.non_retryable
    return raised.value, edge


def test_an_attempt_the_cluster_did_not_sign_for_this_node_is_refused_reported_and_not_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    touch = unsigned("touch", str(marker))
    other_ca = pki.new_ca("test", "cluster")  # same cluster name, another key
    cases = {
        "no grant": (touch, "carries no grant"),
        "another CA": (signed(touch, other_ca, node_id=NODE_ID), "does not verify"),
        "command changed after signing": (
            {**sign(unsigned("true")), "command": ["touch", str(marker)]},
            "command is not the one the grant signed",
        ),
        "env changed after signing": (
            {**sign(touch), "env": {"LD_PRELOAD": "/tmp/x.so"}},
            "environment is not the one",
        ),
        "timeout dropped after signing": (
            {**sign({**touch, "timeout": 5.0}), "timeout": None},
            "timeout is not the one",
        ),
        "another node": (
            signed(touch, CLUSTER_CA, node_id="node-ffffffffffff"),
            "names node_id 'node-ffffffffffff'",
        ),
        "another tenant": (sign(touch, tenant="acme"), "names tenant 'acme'"),
        "another cluster": (sign(touch, cluster="prod"), "names cluster 'prod'"),
        "not a grant": (
            {**touch, "grant": {"payload": "!!", "signature": "AAAA"}},
            "not base64",
        ),
    }
    node = tmp_path / "node"
    node.mkdir()
    for case, (raw, why) in cases.items():
        error, edge = refused(raw, node)
        assert why in str(error), case
        [(kind, fields)] = edge.notified
        assert kind == "attempt_refused", case
        assert (fields["job"], fields["attempt"]) == (JOB, 1), case
        assert why in fields["reason"], case
        assert edge.sent == [] and edge.done == [], case
    assert not marker.exists(), "nothing ran"
    assert not supervisor_client.find_all(node), "no directory was made"


def test_an_attempt_is_run_once_a_replay_of_it_is_refused(tmp_path: Path) -> None:
    # Where the job may write: not the test's own directory (the agent's, private), nor
    # /tmp (its own); a file of root's, since the sweep removes what the job's UID owns.
    shared = Path(tempfile.mkdtemp(prefix="oz0-test-replay-", dir="/dev/shm"))
    shared.chmod(0o777)
    (shared / "count").touch(mode=0o666)
    (shared / "count").chmod(0o666)
    try:
        raw = spec("sh", "-c", f"echo once >> {shared}/count")
        assert run_attempt(raw, RecordingEdge(), tmp_path)["exit_code"] == 0
        error, _ = refused(raw, tmp_path)
        assert f"has run job {JOB} attempt 1 already" in str(error)
        assert (shared / "count").read_text() == "once\n"
    finally:
        shutil.rmtree(shared)
    record = tmp_path / "attempts-run"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text()).keys() == {f"{JOB}/1"}


def test_a_grant_expires_at_its_not_after_and_the_run_record_forgets_it_then(
    tmp_path: Path,
) -> None:
    now = [1_000_000.0]
    check = GrantCheck(
        cluster="test",
        tenant="default",
        node_id=NODE_ID,
        ca=CLUSTER_CA.cert,
        record=RunRecord.load(tmp_path),
        clock=lambda: now[0],
    )

    def attempt(number: int, not_after: float) -> dict[str, Any]:
        return sign(unsigned("true", attempt=number), not_after=int(not_after))

    # Within the clock skew past not_after: still good; beyond it: expired.
    check.check(attempt(1, now[0] - CLOCK_SKEW + 1))
    with pytest.raises(AttemptRefused, match="expired"):
        check.check(attempt(2, now[0] - CLOCK_SKEW - 1))
    check.check(attempt(3, now[0] + 60))
    record = tmp_path / "attempts-run"
    assert json.loads(record.read_text()).keys() == {f"{JOB}/1", f"{JOB}/3"}
    now[0] += 61 + CLOCK_SKEW  # both grants are past, and their skew
    check.check(attempt(4, now[0] + 60))
    assert json.loads(record.read_text()).keys() == {f"{JOB}/4"}, "expired ones are pruned"
    with pytest.raises(AttemptRefused, match="expired"):
        check.check(attempt(3, now[0] - 61))  # pruned, but its grant cannot come back


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda p: p.write_text('{"job-00000000abcd/1": 17'), "not JSON"),
        (lambda p: p.write_text("[]"), "not a JSON object"),
        (lambda p: p.write_text('{"job-00000000abcd/1": "soon"}'), "has no not_after"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "not JSON"),
        (lambda p: p.mkdir(), "Is a directory"),
    ],
    ids=["cut short", "a list", "an entry without a number", "not text", "a directory"],
)
def test_an_unreadable_run_record_refuses_every_attempt_until_it_is_repaired(
    damage: Callable[[Path], object], said: str, tmp_path: Path
) -> None:
    path = tmp_path / "attempts-run"
    damage(path)
    check = GrantCheck(
        cluster="test",
        tenant="default",
        node_id=NODE_ID,
        ca=CLUSTER_CA.cert,
        record=RunRecord.load(tmp_path),
    )
    changed: list[str | None] = []
    check.record.on_change = lambda: changed.append(check.record.unusable)
    for number in (1, 2):
        with pytest.raises(AttemptRefused) as refused_by:
            check.check(sign(unsigned("true", attempt=number)))
        reason = refused_by.value.reason
        assert reason.startswith(f"cannot read {path}, this node's record of the attempts it ran")
        assert said in reason and "no attempt runs here until it is repaired" in reason
        assert "fix its JSON or remove it" in reason and "\n" not in reason
    assert path.exists(), "never written over"
    assert changed == []
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    check.check(sign(unsigned("true", attempt=1)))  # read again: repaired, no restart
    assert changed == [None], "said once"
    assert json.loads(path.read_text()).keys() == {f"{JOB}/1"}
