from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

from fixtures.cluster import REPO, ServerProcess, cli_command
from fixtures.keys import assert_no_file_holds_key_of, served_public_key
from oz0.context import Context
from tests.conftest import CliRunner


def dev_server(data_dir: Path, workdir: Path) -> ServerProcess:
    env = dict(os.environ)
    env.pop("OZ0_DB", None)
    env.update(TMPDIR=str(workdir / "tmp"), HOME=str(workdir / "home"), PYTHONPATH=str(REPO))
    args = cli_command(
        "server", "start", "--dev", "--data-dir", str(data_dir), "--advertise", "127.0.0.21"
    )
    return ServerProcess(args=args, env=env, cwd=workdir)


@pytest.mark.slow
def test_dev_mode_initialises_once_and_reuses_its_directory(cli: CliRunner, tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    first = dev_server(data_dir, tmp_path / "run1")
    try:
        first.start(ready="export OZ0_CONTEXT=")
        out = "".join(first.stdout_lines)
        assert "web UI:    https://127.0.0.21:8443" in out
        assert "password" in out
        assert "CA hash:   sha256:" in out
        context_path = data_dir / "context" / "context.json"
        assert f"export OZ0_CONTEXT={context_path}" in out
        assert (data_dir / "master.key").stat().st_mode & 0o777 == 0o600
        assert Context.load(context_path).servers == ("127.0.0.21:8443",)

        env = {"OZ0_CONTEXT": str(context_path)}
        info = cli("cluster", "info", "--json", env=env)
        assert info.code == 0, info.err
        assert info.json()["name"] == "dev"
        assert [s["advertise"] for s in info.json()["servers"]] == ["127.0.0.21"]
        assert info.json()["servers"][0]["temporal"] == "serving"
        ca_hash = info.json()["ca_hash"]
        assert f"CA hash:   {ca_hash}" in out

        issued = cli(
            "server", "operator", "issue", "bob", "--dev", "--data-dir", str(data_dir),
            "--operator-dir", str(tmp_path / "bob"),
        )  # fmt: skip
        assert issued.code == 0, issued.err
        bob = cli(
            "cluster", "info", "--json", env={"OZ0_CONTEXT": str(tmp_path / "bob" / "context.json")}
        )
        assert bob.code == 0, bob.err
        public = served_public_key("127.0.0.21", data_dir / "context" / "ca.crt")
        assert_no_file_holds_key_of(public, [data_dir, tmp_path, Path(tempfile.gettempdir())])
    finally:
        first.stop(signal.SIGTERM)

    second = dev_server(data_dir, tmp_path / "run2")
    try:
        second.start(ready="export OZ0_CONTEXT=")
        out = "".join(second.stdout_lines)
        assert "password" not in out
        assert f"CA hash:   {ca_hash}" in out
        assert cli("cluster", "info", env={"OZ0_CONTEXT": str(context_path)}).code == 0
    finally:
        # The docs promise 5 s; twice that here, as a loaded machine is slower (no hang).
        assert second.stop(signal.SIGTERM) < 10.0
