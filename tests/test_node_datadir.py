"""The node's data directory: where it is (oz0_common.datadir), the old flat identity
layout moved into identity/, the directories a purge removes above it, and the systemd
unit `oz0-node install-service` writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from oz0_common.datadir import CREATED_PARENTS_FILE, ENV_VAR, node_data_dir
from oz0_node import identity, main, purge, service
from oz0_node.errors import AgentError
from oz0_node.identity import IdentityDir, NodeRecord
from oz0_node.jobs.isolation import STANDARD_PATH, Isolation
from oz0_node.jobs.job_user import DEFAULT_JOB_USER, JobUser

RECORD = NodeRecord(cluster="prod", ca_hash="sha256:" + "ab" * 32, node_id="node-00ff")


def test_the_data_dir_is_the_option_else_the_variable_else_the_default_for_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {ENV_VAR: str(tmp_path / "from-env"), "HOME": str(tmp_path / "home")}
    assert node_data_dir(tmp_path / "given", environ=env, euid=1000) == tmp_path / "given"
    assert node_data_dir(None, environ=env, euid=1000) == tmp_path / "from-env"
    assert node_data_dir(None, environ=env, euid=0) == tmp_path / "from-env"
    home_only = {"HOME": str(tmp_path / "home")}
    assert node_data_dir(None, environ=home_only, euid=0) == Path("/var/lib/oz0-node")
    user_default = tmp_path / "home" / ".local" / "share" / "oz0-node"
    assert node_data_dir(None, environ=home_only, euid=1000) == user_default
    assert node_data_dir(None, environ={**home_only, ENV_VAR: ""}, euid=1000) == user_default
    monkeypatch.chdir(tmp_path)
    assert node_data_dir("relative", environ={}, euid=1000) == tmp_path / "relative"
    assert node_data_dir("~/x", environ={}, euid=1000) == Path.home() / "x"


def test_oz0_node_status_finds_the_data_dir_through_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "node"
    ids = IdentityDir(data_dir)
    ids.create()
    ids.save_record(RECORD)
    monkeypatch.setenv(ENV_VAR, str(data_dir))
    assert main.run(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["node_id"] == "node-00ff"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(ENV_VAR)
    if os.geteuid() != 0:
        assert main.run(["status"]) == 1
        default = tmp_path / "home" / ".local" / "share" / "oz0-node"
        assert f"error: {default} holds no node identity" in capsys.readouterr().err


def flat_node(data_dir: Path) -> dict[str, bytes]:
    """A data directory in the flat layout: the identity files directly in it."""
    data_dir.mkdir(mode=0o700)
    files = {
        identity.KEY_FILE: b"key",
        identity.CERT_FILE: b"cert",
        identity.CA_FILE: b"ca",
        identity.RECORD_FILE: json.dumps(RECORD.to_json()).encode(),
    }
    for name, data in files.items():
        (data_dir / name).write_bytes(data)
        (data_dir / name).chmod(0o600)
    return files


def test_a_flat_layout_is_moved_into_identity(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    files = flat_node(data_dir)
    (data_dir / "runtimes").mkdir()
    ids = IdentityDir(data_dir)
    assert ids.has_flat_layout() and ids.load_record() is None
    ids.migrate_flat_layout()
    assert not ids.has_flat_layout()
    assert sorted(p.name for p in data_dir.iterdir()) == ["agent.lock", "identity", "runtimes"]
    for name, data in files.items():
        assert (data_dir / "identity" / name).read_bytes() == data
    assert ids.root.stat().st_mode & 0o777 == 0o700
    assert ids.load_record() == RECORD
    ids.migrate_flat_layout()  # nothing left to move: nothing happens
    assert ids.load_record() == RECORD


def test_a_flat_layout_next_to_an_identity_dir_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "node"
    flat_node(data_dir)
    ids = IdentityDir(data_dir)
    ids.create()
    ids.save_record(NodeRecord(cluster="other", ca_hash=RECORD.ca_hash, node_id="node-11"))
    before = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*"))
    with pytest.raises(AgentError, match="both in it and in"):
        ids.migrate_flat_layout()
    assert main.run(["start", "--data-dir", str(data_dir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "move node.key, node.crt, ca.crt, node.json out of" in err
    assert sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*")) == before


def test_status_of_a_flat_layout_says_how_to_move_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "node"
    flat_node(data_dir)
    assert main.run(["status", "--data-dir", str(data_dir)]) == 1
    assert "run `oz0-node start --data-dir" in capsys.readouterr().err
    assert not (data_dir / "identity").exists()


def test_the_directories_made_above_the_data_dir_go_with_it_when_empty(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    data_dir = tmp_path / "home" / ".local" / "share" / "oz0-node"
    ids = IdentityDir(data_dir)
    ids.ensure_data_dir()
    made = [tmp_path / "home" / ".local" / "share", tmp_path / "home" / ".local"]
    assert ids.created_parents() == made
    ids.ensure_data_dir()  # again: DIR exists, the list stays
    assert ids.created_parents() == made
    shutil.rmtree(data_dir)
    purge.remove_empty(made)
    assert list((tmp_path / "home").iterdir()) == []


def test_a_made_parent_that_someone_filled_is_kept_and_a_forged_list_is_ignored(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "a" / "b" / "node"
    ids = IdentityDir(data_dir)
    ids.ensure_data_dir()
    (tmp_path / "a" / "mine.txt").write_text("kept")
    made = ids.created_parents()
    shutil.rmtree(data_dir)
    purge.remove_empty(made)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["mine.txt"]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ids.ensure_data_dir()
    (data_dir / CREATED_PARENTS_FILE).write_text(json.dumps([str(elsewhere)]))
    assert ids.created_parents() == []


def test_an_existing_data_dir_records_no_parents(tmp_path: Path) -> None:
    data_dir = tmp_path / "x" / "node"
    data_dir.mkdir(parents=True)
    IdentityDir(data_dir).ensure_data_dir()
    assert not (data_dir / CREATED_PARENTS_FILE).exists()


def agent_binary(tmp_path: Path) -> Path:
    binary = tmp_path / "bin" / "oz0-node"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return binary


def test_install_service_writes_a_unit_that_stays_down_once_purged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary, unit = agent_binary(tmp_path), tmp_path / "units" / "oz0-node.service"
    data_dir = tmp_path / "node"
    args = ["install-service", "--binary", str(binary), "--data-dir", str(data_dir)]
    assert main.run([*args, "--unit-path", str(unit)]) == 0
    assert f"wrote {unit}" in capsys.readouterr().out
    text = unit.read_text()
    lines = text.splitlines()
    assert f"ExecStart={binary} start --data-dir {data_dir}" in lines
    assert f"ConditionPathExists={binary}" in lines
    assert "Restart=on-failure" in lines and "KillMode=process" in lines
    assert unit.stat().st_mode & 0o777 == 0o644
    # The same unit again is fine; a different one needs --force.
    assert main.run([*args, "--unit-path", str(unit)]) == 0
    other = [*args[:-1], str(tmp_path / "other")]
    assert main.run([*other, "--unit-path", str(unit)]) == 1
    assert "exists and differs; give --force" in capsys.readouterr().err
    assert unit.read_text() == text
    assert main.run([*other, "--unit-path", str(unit), "--force"]) == 0
    assert f"--data-dir {tmp_path / 'other'}" in unit.read_text()


def test_install_service_refuses_a_missing_binary_and_unit_unsafe_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unit = tmp_path / "oz0-node.service"
    missing = tmp_path / "nothing"
    assert main.run(["install-service", "--binary", str(missing), "--unit-path", str(unit)]) == 1
    assert "is not an executable file" in capsys.readouterr().err
    binary = agent_binary(tmp_path)
    spaced = ["--data-dir", str(tmp_path / "my node")]
    assert main.run(["install-service", "--binary", str(binary), *spaced, "--unit-path", str(unit)])
    assert "no spaces or quotes" in capsys.readouterr().err
    assert not unit.exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    binary = agent_binary(tmp_path)
    unit = tmp_path / service.UNIT_NAME
    unit.write_text(service.unit_text(binary, tmp_path / "node", system=True))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_tools_dir_comes_first_on_the_path_of_a_job_run_as_the_agents_user_only(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    tools = str(data / "tools")
    own = Isolation(data, JobUser.of_agent(), drop=False, tracking="subreaper")
    env = own.environment(Path("/w"), {}, {})
    assert env["PATH"].split(os.pathsep)[0] == tools
    assert env["PATH"].split(os.pathsep)[1:] == STANDARD_PATH.split(os.pathsep)
    assert own.environment(Path("/w"), {"PATH": "/opt"}, {})["PATH"] == f"{tools}:/opt"
    # A job user who is not the agent's cannot read DIR/tools/: it is not on its PATH.
    job_user = JobUser.named(DEFAULT_JOB_USER)
    assert job_user is not None
    other = Isolation(data, job_user, drop=True, tracking="subreaper")
    assert other.environment(Path("/w"), {}, {})["PATH"] == STANDARD_PATH
