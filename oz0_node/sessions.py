"""Interactive sessions on this node (docs/sessions.md): a command on a PTY, carried over
the control stream, isolated exactly as an attempt is.

A `session_open` runs only if its grant holds as an attempt's does (jobs/grants.py: the
cluster CA signed it for this cluster, tenant and node, for this session's ID as a job of
one attempt, with this command, and this node has not run it before): the grant is what a
compromised edge cannot forge. It then runs in a place of its own (jobs/isolation.py: its
own UID where the agent gives them, its directory, cgroup and /tmp), its process the
session leader of a new PTY whose window the edge sets and resizes. Its output goes to
the edge as it comes; its exit code once it has ended and its output is read. The place
is undone as an attempt's (every process of it ended, its UID swept).

A session lives no longer than the stream it came on: sessions are the person's, live,
so a stream that ends (the node blocked, the server gone) ends them all (SIGHUP, then
SIGKILL after HANGUP_GRACE), as does `session_close`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from oz0_common import session_messages as sm
from oz0_common.session_messages import EXIT, OUTPUT, REFUSED, STARTED
from oz0_node.jobs.grants import AttemptRefused, GrantCheck
from oz0_node.jobs.isolation import Isolation, Limits, Placement
from oz0_node.messages import Message
from oz0_node.transport import EdgeConnection

log = logging.getLogger(__name__)

# After SIGHUP, how long a session's processes have before SIGKILL.
HANGUP_GRACE = 1.0
# Once the command has exited: how long what it wrote last may take to be read.
DRAIN_TIMEOUT = 1.0
# Undoing a session's place (its processes ended, its UID swept) takes at most this.
END_TIMEOUT = 15.0
TERM = re.compile(r"[A-Za-z0-9._+-]{1,64}\Z")
DEFAULT_TERM = "xterm-256color"


@dataclass
class _Live:
    master: int
    process: trio.Process
    place: Placement
    ended: trio.Event = field(default_factory=trio.Event)


class NodeSessions:
    """The sessions opened on one control stream; `run` holds them, and ends them all
    when it is cancelled (the stream ended)."""

    def __init__(
        self,
        node_id: str,
        conn: EdgeConnection,
        isolation: Isolation | None,
        grants: Callable[[], GrantCheck | None],
    ) -> None:
        self.node_id = node_id
        self.conn = conn
        self.isolation = isolation
        self.grants = grants
        self._live: dict[str, _Live] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await trio.sleep_forever()

    async def opened(self, message: Message) -> None:
        try:
            session = sm.session_of(message)
        except sm.BadSessionMessage as e:
            log.warning("ignoring a session_open from edge %s: %s", self.conn.address, e)
            return
        try:
            command = sm.command_of(message)
            size = sm.WindowSize.of(message)
        except sm.BadSessionMessage as e:
            await self.conn.send(REFUSED, session=session, reason=str(e))
            return
        term = message.get("term")
        if not isinstance(term, str) or not TERM.match(term):
            term = DEFAULT_TERM
        grants, isolation = self.grants(), self.isolation
        if grants is None or isolation is None or self._nursery is None:
            await self.conn.send(
                REFUSED, session=session, reason="this agent runs no jobs, nor sessions"
            )
            return
        try:
            grants.check({**sm.grant_fields(session, command), "grant": message.get("grant")})
        except AttemptRefused as e:
            log.warning("refused session %s from edge %s: %s", session, self.conn.address, e)
            await self.conn.send(REFUSED, session=session, reason=e.reason)
            return
        self._nursery.start_soon(self._run_one, session, command, size, term, isolation)

    async def _run_one(
        self,
        session: str,
        command: list[str],
        size: sm.WindowSize,
        term: str,
        isolation: Isolation,
    ) -> None:
        try:
            place = await trio.to_thread.run_sync(
                isolation.begin, self.node_id, session, 1, {"TERM": term}, Limits()
            )
        except OSError as e:
            why = f"cannot make its working directory, cgroup or UID: {e.strerror or e}"
            await self.conn.send(REFUSED, session=session, reason=why)
            return
        live: _Live | None = None
        try:
            try:
                master, process = await _spawn(command, place, size)
            except (OSError, subprocess.SubprocessError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                await self.conn.send(
                    REFUSED, session=session, reason=f"cannot run {command[0]!r}: {why}"
                )
                return
            place.tracking.started(process.pid)
            live = self._live[session] = _Live(master, process, place)
            log.info("session %s: started process %d", session, process.pid)
            await self.conn.send(STARTED, session=session, user=place.applied.get("user"))
            code = await self._follow(session, live)
            await self.conn.send(EXIT, session=session, code=code)
        finally:
            self._live.pop(session, None)
            with trio.CancelScope(shield=True), trio.move_on_after(END_TIMEOUT):
                await trio.to_thread.run_sync(_end, isolation, place, live)
            log.info("session %s: ended", session)

    async def _follow(self, session: str, live: _Live) -> int:
        """Send the session's output until its command has exited and what it wrote is
        read; its exit code (128 + the signal that ended it)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, session, live)
            returned = await live.process.wait()
            with trio.move_on_after(DRAIN_TIMEOUT):
                await live.ended.wait()
            nursery.cancel_scope.cancel()
        return 128 - returned if returned < 0 else returned

    async def _pump(self, session: str, live: _Live) -> None:
        try:
            while True:
                try:
                    data = os.read(live.master, sm.MAX_DATA)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(live.master)
                    continue
                except OSError as e:
                    if e.errno != errno.EIO:  # EIO: no process holds the PTY any more
                        log.warning("session %s: reading its terminal: %s", session, e)
                    return
                if not data:
                    return
                await self.conn.send(OUTPUT, session=session, data=sm.encode_data(data))
        finally:
            live.ended.set()

    def _find(self, message: Message) -> _Live | None:
        try:
            return self._live.get(sm.session_of(message))
        except sm.BadSessionMessage:
            return None

    async def input(self, message: Message) -> None:
        live = self._find(message)
        if live is None:
            return
        try:
            data = sm.data_of(message)
        except sm.BadSessionMessage as e:
            log.warning("ignoring session input from edge %s: %s", self.conn.address, e)
            return
        while data:
            try:
                written = os.write(live.master, data)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(live.master)
                continue
            except OSError:
                return  # the session is ending
            data = data[written:]

    async def resize(self, message: Message) -> None:
        live = self._find(message)
        if live is None:
            return
        try:
            size = sm.WindowSize.of(message)
        except sm.BadSessionMessage:
            return
        with contextlib.suppress(OSError):
            _set_size(live.master, size)

    async def close(self, message: Message) -> None:
        live = self._find(message)
        if live is not None:
            with contextlib.suppress(OSError):
                live.place.tracking.signal_all(signal.SIGHUP)


def _set_size(fd: int, size: sm.WindowSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


async def _spawn(
    command: list[str], place: Placement, size: sm.WindowSize
) -> tuple[int, trio.Process]:
    """COMMAND started in PLACE as the session leader of a new PTY of SIZE: the PTY's
    master side (non-blocking) and the process."""
    master, slave = os.openpty()
    try:
        _set_size(slave, size)
        user = place.steps.user
        if user is not None:
            # Its own terminal, as login(1) gives one: the user may reopen it (/dev/tty).
            os.fchown(slave, user.uid, user.gid)
            os.fchmod(slave, 0o620)
        steps = place.steps.preexec()

        def preexec() -> None:
            # Run between fork and exec after setsid (start_new_session): the PTY becomes
            # the session's controlling terminal, so Ctrl-C reaches its foreground group.
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            steps()

        process = await trio.lowlevel.open_process(
            command,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=place.workdir,
            env=place.env,
            start_new_session=True,
            preexec_fn=preexec,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    return master, process


def _end(isolation: Isolation, place: Placement, live: _Live | None) -> None:
    """End what is left of the session (SIGHUP, then SIGKILL), then undo its place."""
    tracking = place.tracking
    if live is not None:
        with contextlib.suppress(OSError):
            os.close(live.master)  # the terminal hangs up
        if tracking.alive():
            tracking.signal_all(signal.SIGHUP)
            deadline = _deadline(HANGUP_GRACE)
            while tracking.alive() and not deadline():
                tracking.refresh()
            for _ in range(100):
                if not tracking.alive():
                    break
                tracking.kill_all()
                tracking.refresh()
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(live.process.pid, os.WNOHANG)
    isolation.end(place)


def _deadline(seconds: float) -> Callable[[], bool]:
    """A deadline for a worker thread (no Trio clock there): whether it has passed,
    sleeping a little between two looks."""
    end = time.monotonic() + seconds

    def passed() -> bool:
        if time.monotonic() >= end:
            return True
        time.sleep(0.02)
        return False

    return passed
