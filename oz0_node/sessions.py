"""Interactive sessions on this node (docs/sessions.md): a command on a PTY, or with pipes,
carried over the control stream, isolated exactly as an attempt is.

A `session_open` runs only if its grant holds as an attempt's does (jobs/grants.py: the
cluster CA signed it for this cluster, tenant and node, for this session's ID as a job of
one attempt, with this command and this user, and this node has not run it before): the
grant is what a compromised edge cannot forge. A session as a named user runs only if this
agent lists that user (`--session-users`).

It runs under a supervisor of its own (jobs/session_process.py), forked by the agent's
launcher as an attempt's is, never by the agent, which runs threads: the supervisor makes
its place (jobs/isolation.py: its own UID where the agent gives them, its directory, cgroup
and /tmp), starts the command on a new PTY whose window the edge sets and resizes (or with
pipes: stdout and stderr apart, stdin when the person sends it), and hands this agent the
descriptors it relays. Output goes to the edge as it comes; the exit code once the command
has ended and its output is read. The supervisor then undoes the place as an attempt's is
(every process of it ended, its UID swept).

A session lives no longer than the stream it came on: sessions are the person's, live,
so a stream that ends (the node blocked, the server gone) ends them all (SIGHUP, then
SIGKILL after a second), as does `session_close`; and no longer than this agent: its
supervisor ends it when the agent's end of their socket closes, however the agent ended.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from oz0_common import session_messages as sm
from oz0_common.session_messages import EXIT, OUTPUT, REFUSED, STARTED
from oz0_node.jobs import session_client
from oz0_node.jobs.grants import AttemptRefused, GrantCheck
from oz0_node.jobs.isolation import Isolation
from oz0_node.jobs.launcher import Launcher
from oz0_node.jobs.session_handover import MAX_MESSAGE, SessionSpec, decode, encode
from oz0_node.messages import Message
from oz0_node.transport import EdgeConnection

log = logging.getLogger(__name__)

# Once the command has exited: how long what it wrote last may take to be read.
DRAIN_TIMEOUT = 1.0
# Ending a session (its processes ended, its UID swept) takes at most this.
END_TIMEOUT = 15.0
TERM = re.compile(r"[A-Za-z0-9._+-]{1,64}\Z")
DEFAULT_TERM = "xterm-256color"
# The code said when a session's supervisor died before it said the command's.
LOST = 255


@dataclass
class _Live:
    started: session_client.Started
    readers: int = 0  # output descriptors not read to their end yet
    drained: trio.Event = field(default_factory=trio.Event)

    def fd(self, name: str) -> int | None:
        return self.started.fds.get(name)


class NodeSessions:
    """The sessions opened on one control stream; `run` holds them, and ends them all
    when it is cancelled (the stream ended)."""

    def __init__(
        self,
        node_id: str,
        conn: EdgeConnection,
        isolation: Isolation | None,
        grants: Callable[[], GrantCheck | None],
        *,
        launcher: Launcher | None = None,
        users: frozenset[str] = frozenset(),
    ) -> None:
        self.node_id = node_id
        self.conn = conn
        self.isolation = isolation
        self.grants = grants
        self.launcher = launcher
        self.users = users  # the accounts sessions may run as (--session-users)
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
            mode = sm.Mode.of(message)
        except sm.BadSessionMessage as e:
            await self.conn.send(REFUSED, session=session, reason=str(e))
            return
        term = message.get("term")
        if not isinstance(term, str) or not TERM.fullmatch(term):
            term = DEFAULT_TERM
        grants, isolation = self.grants(), self.isolation
        if grants is None or isolation is None or self._nursery is None:
            await self.conn.send(
                REFUSED, session=session, reason="this agent runs no jobs, nor sessions"
            )
            return
        try:
            grants.check(
                {**sm.grant_fields(session, command, mode.user), "grant": message.get("grant")}
            )
        except AttemptRefused as e:
            log.warning("refused session %s from edge %s: %s", session, self.conn.address, e)
            await self.conn.send(REFUSED, session=session, reason=e.reason)
            return
        if mode.user is not None and mode.user not in self.users:
            why = f"this node does not allow sessions as {mode.user} (oz0-node --session-users)"
            log.warning("refused session %s from edge %s: %s", session, self.conn.address, why)
            await self.conn.send(REFUSED, session=session, reason=why)
            return
        spec = SessionSpec(
            node_id=self.node_id, session=session, command=tuple(command),
            term=term if mode.tty else None, tty=mode.tty, stdin=mode.stdin,
            rows=size.rows, cols=size.cols, user=mode.user,
        )  # fmt: skip
        self._nursery.start_soon(self._run_one, spec, isolation)

    async def _run_one(self, spec: SessionSpec, isolation: Isolation) -> None:
        session = spec.session
        try:
            started = await trio.to_thread.run_sync(
                session_client.launch, isolation.data_dir, spec, isolation, self.launcher
            )
        except session_client.SessionNotStarted as e:
            await self.conn.send(REFUSED, session=session, reason=str(e))
            return
        except OSError as e:  # no socket, pipe or process to be had: the machine is full
            why = f"cannot start its supervisor: {e.strerror or e}"
            log.warning("session %s: %s", session, why)
            await self.conn.send(REFUSED, session=session, reason=why)
            return
        live = self._live[session] = _Live(started)
        try:
            log.info("session %s: started", session)
            await self.conn.send(STARTED, session=session, user=started.user)
            code = await self._follow(session, live)
            await self.conn.send(EXIT, session=session, code=code)
        finally:
            self._live.pop(session, None)
            with trio.CancelScope(shield=True), trio.move_on_after(END_TIMEOUT):
                await _end(live)
            log.info("session %s: ended", session)

    async def _follow(self, session: str, live: _Live) -> int:
        """Send the session's output until its command has exited and what it wrote is
        read; its exit code (128 + the signal that ended it), as its supervisor says."""
        async with trio.open_nursery() as nursery:
            for name in ("pty", "stdout", "stderr"):
                fd = live.fd(name)
                if fd is not None:
                    live.readers += 1
                    nursery.start_soon(self._pump, session, live, fd, name == "stderr")
            code = await _exit_code(live.started)
            with trio.move_on_after(DRAIN_TIMEOUT):
                await live.drained.wait()
            nursery.cancel_scope.cancel()
        if code is None:
            log.warning("session %s: its supervisor ended without its exit code", session)
            return LOST
        return code

    async def _pump(self, session: str, live: _Live, fd: int, stderr: bool) -> None:
        stream = {"stream": sm.STDERR} if stderr else {}
        try:
            while True:
                try:
                    data = os.read(fd, sm.MAX_DATA)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(fd)
                    continue
                except OSError as e:
                    if e.errno != errno.EIO:  # EIO: no process holds the PTY any more
                        log.warning("session %s: reading its output: %s", session, e)
                    return
                if not data:
                    return
                await self.conn.send(OUTPUT, session=session, data=sm.encode_data(data), **stream)
        finally:
            live.readers -= 1
            if live.readers == 0:
                live.drained.set()

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
        fd = live.fd("pty")
        if fd is None:
            fd = live.fd(sm.STDIN)
        if fd is None:
            return
        while data:
            try:
                written = os.write(fd, data)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                continue
            except OSError:
                return  # the session is ending, or its command closed its stdin
            data = data[written:]
        if message.get("eof") is True and live.fd("pty") is None:
            # Without a terminal, the end of the person's stdin is its stdin's end.
            fd = live.started.fds.pop(sm.STDIN)
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    async def resize(self, message: Message) -> None:
        live = self._find(message)
        fd = live.fd("pty") if live is not None else None
        if fd is None:
            return
        try:
            size = sm.WindowSize.of(message)
        except sm.BadSessionMessage:
            return
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))

    async def close(self, message: Message) -> None:
        live = self._find(message)
        if live is not None:
            await _tell(live.started, hangup=True)


async def _tell(started: session_client.Started, **fields: object) -> None:
    """Say FIELDS to the session's supervisor (nothing if it is gone)."""
    sock = started.supervisor
    while True:
        try:
            sock.send(encode(**fields))
            return
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
        except OSError:
            return


async def _exit_code(started: session_client.Started) -> int | None:
    """What the supervisor says of the command's exit: its code; None if it ended first."""
    sock = started.supervisor
    while True:
        try:
            data = sock.recv(MAX_MESSAGE)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        except OSError:
            return None
        if not data:
            return None
        code = decode(data).get("exit")
        if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
            return code


async def _end(live: _Live) -> None:
    """End the session: its descriptors closed (its terminal hangs up), its supervisor told
    to end what is left and sweep its UID, and waited for."""
    started = live.started
    for fd in started.fds.values():
        trio.lowlevel.notify_closing(fd)
    started.close_fds()
    await _tell(started, end=True)
    sock = started.supervisor
    try:
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError:
                break
            if not data:
                break  # it has exited: nothing of the session is left
    finally:
        trio.lowlevel.notify_closing(sock)
        sock.close()
    if started.dir is not None and started.dir.exists():
        # It died before it could finish: what it recorded is ended here.
        await trio.to_thread.run_sync(session_client.end_dir, started.dir)
