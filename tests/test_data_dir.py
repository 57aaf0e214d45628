"""The data directory as the agent file's bootstrap reads it from a command line, before
the agent's own parser exists (the rule itself: tests/test_node_datadir.py)."""

from __future__ import annotations

from pathlib import Path

from oz0_common import datadir


def test_the_last_data_dir_on_the_command_line_wins_over_the_environment(
    tmp_path: Path,
) -> None:
    env = {"OZ0_NODE_DATA_DIR": str(tmp_path / "env"), "HOME": str(tmp_path)}
    argv = ["start", "--data-dir", str(tmp_path / "a"), "--data-dir=" + str(tmp_path / "b")]
    assert datadir.data_dir_in_argv(argv, env) == tmp_path / "b"
    assert datadir.data_dir_in_argv(["start", "--data-dir", "rel"], env) == Path.cwd() / "rel"
    assert datadir.data_dir_in_argv(["status"], env) == tmp_path / "env"
    # A trailing --data-dir with no value names nothing.
    assert datadir.data_dir_in_argv(["start", "--data-dir"], env) == tmp_path / "env"
