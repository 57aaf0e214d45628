"""Plugins: the executables in DIR/plugins/, run by the agent alongside its runtime.

They run while the runtime is kept (the node accepted and its control stream up, with a
Temporal frontend named), so whatever stops the runtime stops them too: a block, a purge
(before the data directory is deleted), SIGTERM or SIGINT to the agent, a lost stream.
DIR/plugins/ is read when they start; a file added later runs from the next start.

Each plugin runs with no arguments, stdin from /dev/null, in DIR, in a session (and so a
process group) of its own, with the agent's environment plus OZ0_NODE_DATA_DIR,
OZ0_NODE_ID and DIR/tools/ first on PATH. Its stdout and stderr are appended to
DIR/logs/plugin-NAME.log (0600; moved to NAME.log.1 at a start once past MAX_LOG_BYTES).
Stopping it: SIGTERM to its group, SIGKILL to what is left of the group STOP_GRACE later.
If it ends by itself (or cannot be started), what is left of its group is ended the same
way and it is started again after RESTART_FIRST, doubling up to RESTART_MAX; a plugin
that ran STABLE_AFTER or longer starts again from RESTART_FIRST.
Only regular files (or links to them) with an execute bit, whose names do not start with a
dot, are plugins; anything else there is skipped with a warning. A plugin is run only under
strict modes (oz0_common.strict_modes): it, a link's target and every directory above each
of them owned by the agent's user or root and writable by nobody else; a plugin that is not
is refused with one warning naming the path at fault, checked when the plugins are read
and again before each restart, and the others run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from oz0_common import strict_modes
from oz0_node import layout
from oz0_node.jobs.process import members

log = logging.getLogger(__name__)

STOP_GRACE = 5.0
RESTART_FIRST = 1.0
RESTART_MAX = 60.0
STABLE_AFTER = 60.0
MAX_LOG_BYTES = 10 << 20
# While a group is given its grace, how often it is looked at.
GONE_POLL = 0.05
# After SIGKILL, how long the plugin's group may take to be gone.
REAP_TIMEOUT = 2.0


def plugins_dir(data_dir: Path) -> Path:
    return data_dir / layout.PLUGINS_DIR


def logs_dir(data_dir: Path) -> Path:
    return data_dir / layout.LOGS_DIR


def discover(data_dir: Path) -> list[Path]:
    """The plugins in DIR/plugins/, by name; none when there is no such directory."""
    directory = plugins_dir(data_dir)
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return []
    except OSError as e:
        log.warning("cannot read %s: %s; running no plugins", directory, e.strerror or e)
        return []
    found = []
    for path in entries:
        if path.name.startswith("."):
            continue
        try:
            mode = path.stat().st_mode
        except OSError as e:
            log.warning("plugin %s skipped: %s", path, e.strerror or e)
            continue
        if not stat.S_ISREG(mode) or not mode & 0o111:
            log.warning("plugin %s skipped: not an executable file", path)
            continue
        why = strict_modes.refusal(path)
        if why is not None:
            log.warning("plugin %s refused: %s", path.name, why)
            continue
        found.append(path)
    return found


class PluginProcess(Protocol):
    """What the supervisor needs of a started plugin (tests pass fakes)."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int:
        """Its exit status, once it has exited (at once if it has)."""

    def signal_group(self, sig: signal.Signals) -> bool:
        """Send SIG to its process group; False when that group is gone."""

    def group_alive(self) -> bool:
        """Whether anything of its group runs (zombies do not count)."""


Launch = Callable[[Path, Path, Mapping[str, str], Path], Awaitable[PluginProcess]]


class _Started:
    """A real plugin process: a session leader, so its group's ID is its PID."""

    def __init__(self, process: trio.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def wait(self) -> int:
        return await self._process.wait()

    def signal_group(self, sig: signal.Signals) -> bool:
        try:
            os.killpg(self._process.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def group_alive(self) -> bool:
        return bool(members(self._process.pid))


async def launch_process(
    plugin: Path, log_path: Path, env: Mapping[str, str], cwd: Path
) -> PluginProcess:
    """Start PLUGIN in a session of its own, its output appended to LOG_PATH."""
    _rotate(log_path)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = await trio.lowlevel.open_process(
            [str(plugin)],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=dict(env),
            cwd=str(cwd),
            start_new_session=True,
        )
    finally:
        os.close(fd)
    return _Started(process)


def _rotate(log_path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if log_path.stat().st_size > MAX_LOG_BYTES:
            log_path.replace(log_path.with_name(log_path.name + ".1"))


@dataclass(frozen=True)
class PluginSettings:
    data_dir: Path
    node_id: str
    environ: Mapping[str, str]

    def env(self) -> dict[str, str]:
        env = layout.with_tools_on_path(self.environ, self.data_dir)
        env["OZ0_NODE_DATA_DIR"] = str(self.data_dir)
        env["OZ0_NODE_ID"] = self.node_id
        return env


async def run_all(
    settings: PluginSettings,
    *,
    launch: Launch = launch_process,
    task_status: trio.TaskStatus[list[Path]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run every plugin of DIR/plugins/ until cancelled, then stop them all (bounded)."""
    found = discover(settings.data_dir)
    if found:
        logs = logs_dir(settings.data_dir)
        try:
            logs.mkdir(mode=0o700, exist_ok=True)
        except OSError as e:
            # Plugins are the node owner's additions: never a reason to lose the stream.
            log.warning("cannot create %s: %s; running no plugins", logs, e.strerror or e)
            found = []
    if found:
        log.info("starting %d plugin(s): %s", len(found), ", ".join(p.name for p in found))
    async with trio.open_nursery() as nursery:
        for plugin in found:
            nursery.start_soon(supervise, plugin, settings, launch)
        task_status.started(found)


async def supervise(plugin: Path, settings: PluginSettings, launch: Launch) -> None:
    """Keep PLUGIN running, restarted with backoff, until cancelled; then stop it."""
    log_path = logs_dir(settings.data_dir) / f"plugin-{plugin.name}.log"
    delay = RESTART_FIRST
    while True:
        began = trio.current_time()
        # Again at each start: what was safe when the plugins were read may be no longer.
        why = strict_modes.refusal(plugin)
        if why is not None:
            log.warning("plugin %s refused: %s; not starting it again", plugin.name, why)
            return
        try:
            process = await launch(plugin, log_path, settings.env(), settings.data_dir)
        except OSError as e:
            log.warning(
                "plugin %s cannot be started: %s; trying again in %g s",
                plugin.name,
                e.strerror or e,
                delay,
            )
        else:
            log.info("plugin %s started, pid %d", plugin.name, process.pid)
            try:
                code = await process.wait()
            finally:
                with trio.CancelScope(shield=True):
                    await stop_group(process)
            if trio.current_time() - began >= STABLE_AFTER:
                delay = RESTART_FIRST
            log.warning(
                "plugin %s exited with status %s; starting it again in %g s",
                plugin.name,
                code,
                delay,
            )
        await trio.sleep(delay)
        delay = min(2 * delay, RESTART_MAX)


async def stop_group(process: PluginProcess) -> None:
    """SIGTERM to the plugin's group, SIGKILL to what is left STOP_GRACE later; bounded."""
    if not process.signal_group(signal.SIGTERM):
        await process.wait()
        return
    with trio.move_on_after(STOP_GRACE):
        await process.wait()
        # No event tells when the last member of a group is gone.
        while process.group_alive():  # noqa: ASYNC110
            await trio.sleep(GONE_POLL)
        return
    log.warning("plugin pid %d outlived its %g s grace; killing its group", process.pid, STOP_GRACE)
    process.signal_group(signal.SIGKILL)
    with trio.move_on_after(REAP_TIMEOUT):
        await process.wait()
        # A killed process lingers until the kernel has torn it down.
        while process.group_alive():  # noqa: ASYNC110
            await trio.sleep(GONE_POLL)
