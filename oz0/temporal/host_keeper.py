"""The temporal role's host keeper: run the host as a child, restart it when it dies, talk to it.

The host reads its configuration and PEMs on stdin and answers each later command with
an acknowledgement on stdout, so a caller of `HostKeeper.command` knows the change is in
force. Closing its stdin stops it; so does our death, since the kernel then closes it.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any, NoReturn

import trio

from oz0.errors import Oz0Error
from oz0.temporal import host_logs
from oz0.temporal.host import TemporalStores, host_binary

log = logging.getLogger(__name__)

READY_TIMEOUT = 120.0
STOP_GRACE = 3.0
# How long the last log lines of a host that exited may take to arrive.
LOG_DRAIN = 1.0
COMMAND_TIMEOUT = 10.0
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
# A host that served this long before dying starts again from the shortest backoff.
STABLE_AFTER = 60.0


class HostFailed(Oz0Error):
    pass


class HostUnavailable(Oz0Error):
    """No host is serving right now (starting or restarting)."""


@dataclass(frozen=True)
class HostSettings:
    stores: TemporalStores
    history_shards: int
    advertise: str
    bind: str
    cluster_name: str

    def config(
        self,
        tls: dict[str, str],
        nodes: dict[str, dict[str, str]],
        operators: dict[str, dict[str, Any]],
    ) -> dict[str, Any]:
        return {
            "postgres": self.stores.to_json(),
            "numHistoryShards": self.history_shards,
            "advertise": self.advertise,
            "bindIP": self.bind,
            "clusterName": self.cluster_name,
            "tls": tls,
            "nodes": nodes,
            "operators": operators,
            "readyTimeoutSeconds": int(READY_TIMEOUT),
        }


class _Host:
    """One running host process."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._ids = count(1)
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._send_lock = trio.Lock()
        self.serving = trio.Event()
        self.serving_info: dict[str, Any] = {}
        self.failure: str | None = None
        self._log_buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        async with self._send_lock:
            await self.process.stdin.send_all((json.dumps(message) + "\n").encode())

    async def command(self, op: str, **fields: Any) -> dict[str, Any]:
        command_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[command_id] = send
        try:
            await self.send({"id": command_id, "op": op, **fields})
            with trio.fail_after(COMMAND_TIMEOUT):
                answer = await receive.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
            raise HostUnavailable("the Temporal host went away") from None
        except trio.TooSlowError:
            raise HostUnavailable(f"the Temporal host did not acknowledge {op}") from None
        finally:
            del self._waiting[command_id]
        if answer.get("error"):
            raise HostFailed(f"the Temporal host refused {op}: {answer['error']}")
        return answer

    async def read_messages(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self._dispatch(line)
        for send in list(self._waiting.values()):
            send.close()

    async def read_log(self) -> None:
        """Pass Temporal's log lines (the host's stderr) to our logging until it closes.

        Cancelling it loses nothing: a partial line waits in the buffer for the next call,
        which `_stop` makes so the host never blocks on a full pipe while it stops.
        """
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.receive_some():
            self._log_buffer += chunk
            *lines, self._log_buffer = self._log_buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    host_logs.host_line(line.decode(errors="replace"))
        if self._log_buffer.strip():
            host_logs.host_line(self._log_buffer.decode(errors="replace"))
        self._log_buffer = b""

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            log.warning("unreadable line from the Temporal host: %r", line[:200])
            return
        if not isinstance(message, dict):
            return
        if "ack" in message:
            waiter = self._waiting.get(message["ack"])
            if waiter is not None:
                waiter.send_nowait(message)
        elif message.get("event") == "serving":
            self.serving_info = message
            self.serving.set()
        elif message.get("event") == "error":
            self.failure = str(message.get("error") or message)
        else:
            log.debug("Temporal host event: %s", message)


StateListener = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class HostTables:
    """What a (re)starting host is given whole, each read afresh at every start: the node
    table (NodeAccessSync.full_table) and the operators' grants (OperatorAccessSync's)."""

    nodes: Callable[[], Awaitable[dict[str, dict[str, str]]]]
    # operator name -> its current certificate's serial, role and tenants (what it may read)
    operators: Callable[[], Awaitable[dict[str, dict[str, Any]]]]


# What `HostKeeper.state` can be.
HOST_STATES = ("starting", "serving", "restarting")


@dataclass
class HostKeeper:
    """Keeps one host serving; others call `command` to change what it enforces."""

    settings: HostSettings
    tls: Callable[[], dict[str, str]]
    on_state: StateListener
    state: str = "starting"
    served: bool = False
    # Times the host stopped after serving once and was started again (the metrics show it).
    restarts: int = 0
    _host: _Host | None = None
    # Set, and replaced, each time a host (re)starts serving: `next_serving`.
    _served_again: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int | None:
        return self._host.process.pid if self._host else None

    async def command(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send OP to the serving host and wait for its acknowledgement."""
        host = self._host
        if host is None or not host.serving.is_set():
            raise HostUnavailable(f"Temporal is {self.state}; try again shortly")
        return await host.command(op, **fields)

    async def next_serving(self) -> None:
        """Return when a host next starts serving (its first start or a restart)."""
        await self._served_again.wait()

    async def _set_state(self, state: str) -> None:
        self.state = state
        if state == "serving":
            self._served_again.set()
            self._served_again = trio.Event()
        await self.on_state(state)

    async def run(
        self,
        tables: HostTables,
        *,
        task_status: trio.TaskStatus[HostKeeper] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the host with TABLES and keep it running. The first start must succeed: a
        failure then is a configuration problem and ends the server with its reason."""
        backoff = BACKOFF_FIRST
        while True:
            began = trio.current_time()
            try:
                await self._run_once(tables, task_status)
                reason = "exited"
            except HostFailed as e:
                if not self.served:
                    raise
                reason = str(e)
            if trio.current_time() - began > STABLE_AFTER:
                backoff = BACKOFF_FIRST
            log.error("Temporal host stopped (%s); restarting in %.0fs", reason, backoff)
            await self._set_state("restarting")
            self.restarts += 1
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _run_once(self, tables: HostTables, task_status: trio.TaskStatus[HostKeeper]) -> None:
        config = self.settings.config(self.tls(), await tables.nodes(), await tables.operators())
        process = await trio.lowlevel.open_process(
            [str(host_binary()), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        host = _Host(process)
        log.info("Temporal host started, pid %d", process.pid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(host.read_messages)
                nursery.start_soon(host.read_log)
                await host.send(config)
                with trio.move_on_after(READY_TIMEOUT):
                    async with trio.open_nursery() as waiting:
                        waiting.start_soon(_cancel_when_exited, process, waiting.cancel_scope)
                        await host.serving.wait()
                        waiting.cancel_scope.cancel()
                if not host.serving.is_set():
                    why = host.failure or (
                        f"exit code {process.returncode}"
                        if process.returncode is not None
                        else f"not serving after {READY_TIMEOUT:.0f}s"
                    )
                    raise HostFailed(f"Temporal host failed to start: {why}")
                self._host = host
                log.info(
                    "Temporal serving on %s after %s ms",
                    host.serving_info.get("frontend"),
                    host.serving_info.get("startMs"),
                )
                await self._set_state("serving")
                if not self.served:
                    self.served = True
                    task_status.started(self)
                await process.wait()
                nursery.cancel_scope.cancel()
            raise HostFailed(host.failure or f"exit code {process.returncode}")
        finally:
            self._host = None
            with trio.CancelScope(shield=True):
                await _stop(host)


async def _cancel_when_exited(process: trio.Process, scope: trio.CancelScope) -> None:
    await process.wait()
    scope.cancel()


async def _stop(host: _Host) -> None:
    """Close the host's stdin (its signal to stop), then kill it if it lingers; read its
    log meanwhile, since it logs a lot while it stops."""
    process = host.process
    async with trio.open_nursery() as nursery:
        nursery.start_soon(host.read_log)
        began = trio.current_time()
        if process.stdin is not None:
            await trio.aclose_forcefully(process.stdin)
        with trio.move_on_after(STOP_GRACE):
            await process.wait()
        if process.returncode is None:
            log.warning(
                "Temporal host %d did not stop in %.0fs; killing it", process.pid, STOP_GRACE
            )
            process.kill()
            await process.wait()
        elif process.returncode == 0:
            # A server's stop waits for this: its share is in the log.
            log.info("Temporal host %d stopped in %.2f s", process.pid, trio.current_time() - began)
        # Its stderr ends with it; the deadline is for a descendant that kept it open.
        nursery.cancel_scope.deadline = trio.current_time() + LOG_DRAIN


async def wake_as_served(keeper: HostKeeper, wake: Callable[[], None]) -> NoReturn:
    """Call WAKE each time KEEPER's host (re)starts serving. A sync of the host's tables
    then pushes at once what the tables read at the host's start missed (a block committed
    while it restarted could not be pushed), not at its next round (RECONCILE_EVERY, up to
    a second later; bench.soak saw a block take 3.2 s)."""
    while True:
        await keeper.next_serving()
        wake()
