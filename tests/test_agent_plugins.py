"""Plugins (oz0_node/plugins.py): their backoff and stop on Trio's mock clock with fake
processes, then real plugin processes: their environment, their logs, their stop."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio
import trio.testing

from fixtures.cluster import alive
from oz0_node import layout, plugins

# Real processes on a loaded machine: generous.
WAIT_BOUND = 15.0


class FakePlugin:
    """A plugin process on the mock clock: it exits after RUNS seconds (None: never by
    itself), at SIGTERM unless it IGNORES_TERM, always at SIGKILL."""

    def __init__(self, pid: int, runs: float | None, ignores_term: bool) -> None:
        self.pid = pid
        self.ignores_term = ignores_term
        self.exited = trio.Event()
        self.signals: list[tuple[float, signal.Signals]] = []
        self.code = 0
        self.runs = runs

    async def wait(self) -> int:
        await self.exited.wait()
        return self.code

    def signal_group(self, sig: signal.Signals) -> bool:
        if self.exited.is_set():
            return False
        self.signals.append((trio.current_time(), sig))
        if sig == signal.SIGKILL or not self.ignores_term:
            self.code = -sig
            self.exited.set()
        return True

    def group_alive(self) -> bool:
        return not self.exited.is_set()


class FakeLauncher:
    """Starts FakePlugins, each running for the next of RUNS (the last repeats)."""

    def __init__(
        self, nursery: trio.Nursery, runs: list[float | None], *, ignores_term: bool = False
    ) -> None:
        self.nursery = nursery
        self.runs = runs
        self.ignores_term = ignores_term
        self.started: list[tuple[float, FakePlugin]] = []
        self.failures = 0

    async def __call__(
        self, plugin: Path, log_path: Path, env: Mapping[str, str], cwd: Path
    ) -> plugins.PluginProcess:
        if self.failures:
            self.failures -= 1
            raise PermissionError(13, "Permission denied")
        runs = self.runs[min(len(self.started), len(self.runs) - 1)]
        process = FakePlugin(1000 + len(self.started), runs, self.ignores_term)
        self.started.append((trio.current_time(), process))
        if runs is not None:
            self.nursery.start_soon(self._exit_after, process, runs)
        return process

    async def _exit_after(self, process: FakePlugin, runs: float) -> None:
        await trio.sleep(runs)
        process.code = 1
        process.exited.set()

    def times(self) -> list[float]:
        return [at for at, _ in self.started]


def settings(data_dir: Path) -> plugins.PluginSettings:
    return plugins.PluginSettings(data_dir, "node-0123456789abcdef", {"PATH": "/usr/bin:/bin"})


def one_plugin(data_dir: Path, name: str = "probe", body: str = "exit 0") -> Path:
    directory = data_dir / "plugins"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


async def test_a_plugin_that_keeps_dying_is_restarted_with_doubling_backoff_up_to_the_cap(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    plugin = one_plugin(tmp_path)
    async with trio.open_nursery() as nursery:
        launcher = FakeLauncher(nursery, [0.0])
        nursery.start_soon(plugins.supervise, plugin, settings(tmp_path), launcher)
        await trio.sleep(300)
        nursery.cancel_scope.cancel()
    # 1, 2, 4 ... 32, then 60 (RESTART_MAX) each time.
    assert launcher.times() == [0, 1, 3, 7, 15, 31, 63, 123, 183, 243]


async def test_a_plugin_that_ran_long_enough_starts_again_from_the_first_delay(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    plugin = one_plugin(tmp_path)
    async with trio.open_nursery() as nursery:
        # Dies at once twice (delays 1, 2), then runs STABLE_AFTER, then dies at once.
        launcher = FakeLauncher(nursery, [0.0, 0.0, plugins.STABLE_AFTER, 0.0])
        nursery.start_soon(plugins.supervise, plugin, settings(tmp_path), launcher)
        await trio.sleep(69)  # not 70: the next start is then, and a tie has no order
        nursery.cancel_scope.cancel()
    stable_end = 3 + plugins.STABLE_AFTER
    # Back to RESTART_FIRST after the long run, then doubling again.
    assert launcher.times() == [0, 1, 3, stable_end + 1, stable_end + 3]


async def test_a_plugin_that_cannot_start_is_tried_again_with_backoff(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    plugin = one_plugin(tmp_path)
    async with trio.open_nursery() as nursery:
        launcher = FakeLauncher(nursery, [None])
        launcher.failures = 3
        nursery.start_soon(plugins.supervise, plugin, settings(tmp_path), launcher)
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert launcher.times() == [7]  # failed at 0, 1 and 3
    assert launcher.started[0][1].signals == [(20, signal.SIGTERM)]


async def test_a_stop_sends_sigterm_and_sigkill_only_after_the_grace(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    plugin = one_plugin(tmp_path)
    async with trio.open_nursery() as outer:
        polite = FakeLauncher(outer, [None])
        stubborn = FakeLauncher(outer, [None], ignores_term=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(plugins.supervise, plugin, settings(tmp_path), polite)
            nursery.start_soon(plugins.supervise, plugin, settings(tmp_path), stubborn)
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
        stopped_at = trio.current_time()
        outer.cancel_scope.cancel()
    assert polite.started[0][1].signals == [(10, signal.SIGTERM)]
    grace_end = 10 + plugins.STOP_GRACE
    assert stubborn.started[0][1].signals == [(10, signal.SIGTERM), (grace_end, signal.SIGKILL)]
    assert stopped_at == grace_end  # the stop waited for both, no longer
    assert len(polite.started) == len(stubborn.started) == 1, "a stop never restarts"


def test_only_executable_files_are_plugins(tmp_path: Path) -> None:
    assert plugins.discover(tmp_path) == []
    wanted = one_plugin(tmp_path, "b-metrics")
    first = one_plugin(tmp_path, "a-watch")
    one_plugin(tmp_path, ".hidden")
    (tmp_path / "plugins" / "README").write_text("not a plugin")
    (tmp_path / "plugins" / "subdir").mkdir()
    (tmp_path / "plugins" / "link").symlink_to(wanted)
    assert plugins.discover(tmp_path) == [first, wanted, tmp_path / "plugins" / "link"]


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def wait_for(path: Path, text: str, *, count: int = 1) -> str:
    """PATH's text once TEXT is in it COUNT times; within WAIT_BOUND."""
    with trio.fail_after(WAIT_BOUND):
        while read(path).count(text) < count:  # noqa: ASYNC110 (a file, no event)
            await trio.sleep(0.05)
    return read(path)


async def test_real_plugins_get_their_environment_log_their_output_and_end_with_their_group(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "node"
    (data_dir / "tools").mkdir(parents=True)
    tool = data_dir / "tools" / "oz0-probe-tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    one_plugin(
        data_dir,
        "watch",
        # A child of its own that would outlive it, and a TERM it answers.
        'sleep 1000 & echo "child $!"\n'
        "trap 'echo \"got TERM\"; exit 0' TERM\n"
        'echo "pid $$ node $OZ0_NODE_ID dir $OZ0_NODE_DATA_DIR cwd $(pwd)"\n'
        "oz0-probe-tool\n"
        "while :; do sleep 0.1; done",
    )
    log_path = data_dir / "logs" / "plugin-watch.log"
    async with trio.open_nursery() as nursery:
        found = await nursery.start(plugins.run_all, settings(data_dir))
        assert [p.name for p in found] == ["watch"]
        started = await wait_for(log_path, "tool ran")
        nursery.cancel_scope.cancel()
    text = log_path.read_text()
    assert f"node node-0123456789abcdef dir {data_dir} cwd {data_dir}" in started
    assert "got TERM" in text
    pids = [int(line.split()[1]) for line in text.splitlines() if line.startswith(("pid", "child"))]
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids), text
    assert log_path.stat().st_mode & 0o777 == 0o600


async def test_a_real_plugin_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plugins, "STOP_GRACE", 1.0)
    data_dir = tmp_path / "node"
    one_plugin(data_dir, "stubborn", "trap '' TERM\necho \"pid $$\"\nwhile :; do sleep 0.1; done")
    log_path = data_dir / "logs" / "plugin-stubborn.log"
    async with trio.open_nursery() as nursery:
        await nursery.start(plugins.run_all, settings(data_dir))
        started = await wait_for(log_path, "pid ")
        began = time.monotonic()
        nursery.cancel_scope.cancel()
    took = time.monotonic() - began
    pid = int(started.split()[1])
    assert not alive(pid)
    assert 1.0 <= took < 5.0, f"stopped after {took:.2f} s"


async def test_what_a_real_plugin_leaves_behind_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plugins, "STOP_GRACE", 1.0)
    data_dir = tmp_path / "node"
    # The plugin itself ends at SIGTERM; the child it started ignores it.
    one_plugin(
        data_dir,
        "leaves",
        "sh -c \"trap '' TERM; while :; do sleep 0.1; done\" &\n"
        'echo "child $!"\n'
        "while :; do sleep 0.1; done",
    )
    log_path = data_dir / "logs" / "plugin-leaves.log"
    async with trio.open_nursery() as nursery:
        await nursery.start(plugins.run_all, settings(data_dir))
        started = await wait_for(log_path, "child ")
        child = int(started.split()[1])
        assert alive(child)
        nursery.cancel_scope.cancel()
    assert not alive(child)


async def test_a_real_plugin_that_exits_is_started_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    one_plugin(data_dir, "brief", 'echo "run $$"\nexit 3')
    log_path = data_dir / "logs" / "plugin-brief.log"
    async with trio.open_nursery() as nursery:
        await nursery.start(plugins.run_all, settings(data_dir))
        # Its first restart comes RESTART_FIRST after its exit.
        await wait_for(log_path, "run ", count=2)
        nursery.cancel_scope.cancel()
    runs = [line for line in log_path.read_text().splitlines() if line.startswith("run ")]
    assert len(set(runs)) == len(runs) >= 2, "each run is a new process"


# --- strict modes ----------------------------------------------------------------------

# A user ID no account has: anything of user nobody's in /tmp is what the pasted join
# command's test (tests/test_agent_file.py) watches, maybe at the same time.
STRANGER = 12345


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]


async def test_a_group_writable_plugin_is_refused_with_one_line_and_the_others_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "node"
    one_plugin(data_dir, "good", 'echo "good ran"\nwhile :; do sleep 0.1; done')
    bad = one_plugin(data_dir, "backup", "touch backup-ran")
    bad.chmod(0o775)
    async with trio.open_nursery() as nursery:
        found = await nursery.start(plugins.run_all, settings(data_dir))
        await wait_for(data_dir / "logs" / "plugin-good.log", "good ran")
        nursery.cancel_scope.cancel()
    assert [p.name for p in found] == ["good"]
    assert not (data_dir / "backup-ran").exists()
    assert not (data_dir / "logs" / "plugin-backup.log").exists()
    assert refusals(caplog) == [
        f"plugin backup refused: {bad} is writable by group (mode 0775); chmod g-w it"
    ]


def test_a_plugin_in_an_other_writable_directory_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one_plugin(tmp_path, "probe")
    (tmp_path / "plugins").chmod(0o757)
    assert plugins.discover(tmp_path) == []
    assert refusals(caplog) == [
        f"plugin probe refused: {tmp_path / 'plugins'} is writable by others (mode 0757); "
        "chmod o-w it"
    ]


def test_a_link_to_a_file_owned_by_another_user_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one_plugin(tmp_path, "probe")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "theirs"
    target.write_text("#!/bin/sh\nexit 0\n")
    target.chmod(0o755)
    os.chown(target, STRANGER, STRANGER)
    link = tmp_path / "plugins" / "linked"
    link.symlink_to(target)
    assert plugins.discover(tmp_path) == [tmp_path / "plugins" / "probe"]
    assert refusals(caplog) == [
        f"plugin linked refused: {target} is owned by uid {STRANGER}, not by root or the "
        f"agent's user root (uid 0); chown it (reached through {link})"
    ]


def test_a_plugin_below_a_sticky_world_writable_directory_is_run_as_below_tmp(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    plugin = one_plugin(shared / "node", "probe")
    assert plugins.discover(shared / "node") == [plugin]


def test_a_tools_dir_holding_a_group_writable_tool_stays_off_path_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "helper"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o775)
    env = {"PATH": "/usr/bin:/bin", "OTHER": "kept"}
    assert layout.with_tools_on_path(env, tmp_path) == env
    assert layout.with_tools_on_path(env, tmp_path) == env
    assert refusals(caplog) == [
        f"tools {tools} refused, not put on PATH: {tool} is writable by group (mode 0775); "
        "chmod g-w it"
    ]
    tool.chmod(0o755)
    assert layout.with_tools_on_path(env, tmp_path)["PATH"] == f"{tools}:/usr/bin:/bin"
