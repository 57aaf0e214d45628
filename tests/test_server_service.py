"""The server under systemd: `server install-service` writes a `Type=notify` unit with no
secret in it (oz0/server/service_unit.py), and a real server tells the socket
$NOTIFY_SOCKET names READY=1 once its API and edge listen, STOPPING=1 when it drains
(oz0/server/systemd_notify.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from fixtures.cluster import ClusterFiles, ServerProcess, end_all
from oz0 import pki
from oz0.errors import MasterKeyError
from oz0.server import service_unit, systemd_notify
from oz0.server.systemd_notify import Notifier
from oz0_common import certs
from tests.conftest import CliRunner

ADVERTISE = "127.0.0.58"  # what cluster_files (tests/conftest.py) advertises
DATABASE_URL = 'postgresql://oz0:s3cret"pw@db.example:5432/oz0'


def _receiver(path: Path) -> socket.socket:
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.settimeout(5)
    return receiver


def test_the_notifier_sends_one_datagram_and_never_fails_its_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify.sock"
    with _receiver(path) as receiver:
        monkeypatch.setenv(systemd_notify.ENV_VAR, str(path))
        notifier = Notifier.from_env()
        # Taken out of the environment: what the server starts does not inherit it.
        assert systemd_notify.ENV_VAR not in os.environ
        assert notifier.notify("READY=1", "STATUS=serving")
        assert receiver.recv(4096) == b"READY=1\nSTATUS=serving"
    # Not under systemd, or its socket gone: nothing happens, nothing is raised.
    assert not Notifier.from_env().notify("READY=1")
    assert not Notifier(str(path)).notify("READY=1")
    assert systemd_notify.parse_address("@oz0/notify") == b"\0oz0/notify"
    assert systemd_notify.parse_address("vsock:2:1234") is None


def _executable(tmp_path: Path) -> Path:
    binary = tmp_path / "venv" / "bin" / "orchestrator-zero"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return binary


@pytest.fixture
def install_args(tmp_path: Path) -> tuple[list[str], Path, Path, Path]:
    """install-service's arguments, the unit, its environment file and the master key."""
    key = tmp_path / "etc" / "master.key"
    key.parent.mkdir()
    pki.write_master_key(key)
    unit, env_file = tmp_path / "units" / service_unit.UNIT_NAME, tmp_path / "etc" / "server.env"
    args = [
        "server", "install-service", "--system", "--advertise", ADVERTISE,
        "--master-key-file", str(key), "--binary", str(_executable(tmp_path)),
        "--env-file", str(env_file), "--unit-path", str(unit),
    ]  # fmt: skip
    return args, unit, env_file, key


def test_install_service_writes_a_notify_unit_with_no_secret_in_it(
    cli: CliRunner, install_args: tuple[list[str], Path, Path, Path], tmp_path: Path
) -> None:
    args, unit, env_file, key = install_args
    done = cli(*args, "--san", "oz0.example", env={"OZ0_DB": DATABASE_URL})
    assert done.code == 0, done.err
    assert f"wrote {unit}" in done.out and f"wrote {env_file} (mode 0600)" in done.out
    text = unit.read_text()
    lines = text.splitlines()
    binary = tmp_path / "venv" / "bin" / "orchestrator-zero"
    assert (
        f"ExecStart={binary} server start --master-key-file %d/master-key"
        f" --advertise {ADVERTISE} --san oz0.example"
    ) in lines
    assert f"LoadCredential=master-key:{key}" in lines
    assert f"EnvironmentFile={env_file}" in lines
    for line in ("Type=notify", "NotifyAccess=main", "DynamicUser=yes", "KillMode=mixed",
                 "NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectSystem=strict",
                 "Restart=on-failure", "WantedBy=multi-user.target"):  # fmt: skip
        assert line in lines, line
    # The password is in the 0600 environment file only, as systemd reads it.
    assert "s3cret" not in text and "postgresql://" not in text
    assert unit.stat().st_mode & 0o777 == 0o644
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_file.read_text() == 'OZ0_DB="postgresql://oz0:s3cret\\"pw@db.example:5432/oz0"\n'

    # The same again is fine, and an existing environment file is kept; a different unit
    # needs --force.
    assert cli(*args, "--san", "oz0.example", env={"OZ0_DB": "other"}).code == 0
    assert "s3cret" in env_file.read_text()
    other = cli(*args, "--user", "oz0", env={"OZ0_DB": DATABASE_URL})
    assert (other.code, other.err) == (
        1,
        f"error: {unit} exists and differs; give --force to replace it\n",
    )
    assert unit.read_text() == text
    assert cli(*args, "--user", "oz0", "--force").code == 0
    assert "User=oz0" in unit.read_text().splitlines()
    assert "DynamicUser=yes" not in unit.read_text()


def test_install_service_refuses_a_shared_key_or_env_file_and_a_missing_url(
    cli: CliRunner,
    install_args: tuple[list[str], Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args, unit, env_file, key = install_args
    monkeypatch.delenv("OZ0_DB", raising=False)
    missing = cli(*args)
    assert missing.code == 1 and "does not exist and OZ0_DB is not set" in missing.err
    env_file.write_text(f"OZ0_DB={DATABASE_URL}\n")
    env_file.chmod(0o644)
    shared = cli(*args)
    assert shared.code == 1 and "open to group or others (mode 0644)" in shared.err
    env_file.chmod(0o600)
    key.chmod(0o640)
    open_key = cli(*args)
    assert open_key.code == 1 and "open to group or others" in open_key.err
    key.chmod(0o600)
    spaced = cli(*args, "--san", "a b")
    assert spaced.code == 1 and "no spaces" in spaced.err
    assert not unit.exists()
    assert cli(*args).code == 0 and unit.exists()


def test_a_user_unit_reads_your_own_key_file(
    cli: CliRunner, install_args: tuple[list[str], Path, Path, Path]
) -> None:
    args, unit, _, key = install_args
    user_args = [a for a in args if a != "--system"]
    assert cli(*user_args, "--no-system", env={"OZ0_DB": DATABASE_URL}).code == 0
    lines = unit.read_text().splitlines()
    assert any(line.endswith(f"--master-key-file {key} --advertise {ADVERTISE}") for line in lines)
    assert "WantedBy=default.target" in lines
    assert not any(line.startswith(("LoadCredential", "DynamicUser")) for line in lines)
    refused = cli(*user_args, "--no-system", "--user", "oz0", "--force")
    assert refused.code == 1 and "--user goes with a system unit" in refused.err


def test_the_key_systemd_hands_the_service_is_read_with_its_acl_mask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd writes a credential 0400 and, on tmpfs, lets the service's user read it with
    # an ACL entry: `stat` then shows the ACL's mask as the group's read bit (0440).
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    key = credentials / service_unit.MASTER_KEY_CREDENTIAL
    pki.write_master_key(key)
    if shutil.which("setfacl") is not None:
        key.chmod(0o400)
        subprocess.run(["setfacl", "-m", "u:nobody:r", str(key)], check=True, timeout=30)
    else:
        key.chmod(0o440)
    assert key.stat().st_mode & 0o777 == 0o440
    with pytest.raises(MasterKeyError, match="open to group or others"):
        pki.read_master_key(key)  # not under systemd
    monkeypatch.setenv(certs.CREDENTIALS_ENV, str(credentials))
    assert len(pki.read_master_key(key)) == pki.MASTER_KEY_BYTES
    # Nothing more: others' bits, or a file outside the service's credentials, are refused.
    elsewhere = tmp_path / "master.key"
    elsewhere.write_bytes(key.read_bytes())
    elsewhere.chmod(0o440)
    with pytest.raises(MasterKeyError, match="open to group or others"):
        pki.read_master_key(elsewhere)
    key.chmod(0o444)
    with pytest.raises(MasterKeyError, match="open to group or others"):
        pki.read_master_key(key)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = tmp_path / service_unit.UNIT_NAME
    unit.write_text(
        service_unit.unit_text(
            service_unit.ServerUnit(
                binary=_executable(tmp_path),
                advertise=ADVERTISE,
                master_key_file=tmp_path / "master.key",
                env_file=tmp_path / "server.env",
                sans=("oz0.example",),
                ui_cert=tmp_path / "ui.crt",
                ui_key=tmp_path / "ui.key",
            ),
            system=True,
        )
    )
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert str(unit) not in done.stderr, done.stderr  # no warning about the unit itself


def test_a_server_says_ready_once_it_listens_and_stopping_when_it_drains(
    cluster_files: ClusterFiles, tmp_path: Path
) -> None:
    path = tmp_path / "notify.sock"
    server = ServerProcess.for_cluster(cluster_files, ADVERTISE, workdir=tmp_path / "server")
    server.env[systemd_notify.ENV_VAR] = str(path)
    with _receiver(path) as receiver:
        receiver.settimeout(60)
        try:
            server.start(timeout=60)
            ready = receiver.recv(4096).decode()
            assert ready.splitlines()[0] == "READY=1", ready
            assert f"STATUS=serving: management https://{ADVERTISE}:8443" in ready
            # Both listeners accept once READY=1 has been told.
            for port in (8443, 7443):
                socket.create_connection((ADVERTISE, port), timeout=5).close()
            # The Temporal host does not speak for the service.
            for child in server.started_children:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                assert not any(v.startswith(b"NOTIFY_SOCKET=") for v in environ)
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            stopping = receiver.recv(4096).decode()
            assert stopping.splitlines()[0] == "STOPPING=1", stopping
            assert server.wait(30) == 0
        finally:
            end_all([server])
