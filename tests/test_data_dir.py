"""The data directory rule the agent file's bootstrap (and the agent) follow."""

from __future__ import annotations

from pathlib import Path

import pytest

from oz0_common import data_dir


def test_the_command_line_wins_over_the_environment(tmp_path: Path) -> None:
    env = {"OZ0_NODE_DATA_DIR": str(tmp_path / "env"), "HOME": str(tmp_path)}
    argv = ["start", "--data-dir", str(tmp_path / "a"), "--data-dir=" + str(tmp_path / "b")]
    assert data_dir.data_dir_from(argv, env) == tmp_path / "b"
    assert data_dir.data_dir_from(["start", "--data-dir", "rel"], env) == Path.cwd() / "rel"
    assert data_dir.data_dir_from(["status"], env) == tmp_path / "env"


def test_the_default_is_per_user_or_for_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"HOME": str(tmp_path)}
    monkeypatch.setattr(data_dir.os, "geteuid", lambda: 1000)
    assert data_dir.data_dir_from(["start"], env) == tmp_path / ".local" / "share" / "oz0-node"
    monkeypatch.setattr(data_dir.os, "geteuid", lambda: 0)
    assert data_dir.data_dir_from(["start"], env) == Path("/var/lib/oz0-node")
    # An empty variable is no choice.
    assert data_dir.default_data_dir({"OZ0_NODE_DATA_DIR": "", **env}) == Path("/var/lib/oz0-node")
