"""The node's runtime: when the agent starts and stops it (fake runtimes, fake edges, on
MockClock), and the real runtime's failures and stop without a Temporal to talk to."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

from fixtures.fake_edges import (
    FakeNet,
    fake_net,
    join_and_stop,
    read_json,
    run_agent,
)
from oz0 import pki
from oz0_node import agent, runtime
from oz0_node.errors import ProtocolViolation
from oz0_node.identity import IdentityDir
from oz0_node.messages import Welcome
from oz0_node.runtime import NodeRuntime, RuntimeFailed, RuntimeSettings

TEMPORAL = "edge-a:7233"


@pytest.fixture
async def net(nursery: trio.Nursery) -> FakeNet:
    return fake_net(nursery, "edge-a:7443")


@dataclass
class FakeRuntimes:
    """Runtimes that run until cancelled (after FAILURES failed starts), and when."""

    data_dir: Path
    failures: int = 0
    started: list[tuple[float, RuntimeSettings]] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)
    # Whether the node's files were still there when each runtime stopped.
    files_at_stop: list[bool] = field(default_factory=list)

    def factory(self, settings: RuntimeSettings) -> runtime.Runtime:
        return FakeRuntime(self, settings)


@dataclass(eq=False)
class FakeRuntime:
    owner: FakeRuntimes
    settings: RuntimeSettings

    async def run(self, running: Callable[[], None]) -> None:
        owner = self.owner
        owner.started.append((trio.current_time(), self.settings))
        if owner.failures:
            owner.failures -= 1
            raise RuntimeFailed("Temporal unreachable")
        running()
        try:
            await trio.sleep_forever()
        finally:
            owner.stopped.append(trio.current_time())
            owner.files_at_stop.append((owner.data_dir / "identity" / "node.key").exists())

    async def stop(self) -> None:
        pass


def reported_runtime(data: Path) -> object:
    return read_json(data / "status.json")["runtime"]


async def test_the_runtime_starts_on_welcome_and_stops_whenever_the_stream_ends(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.temporal = TEMPORAL
    runtimes = FakeRuntimes(data)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data), runtimes.factory)
        welcome = await net.cluster.wait_for("welcome")
        await trio.testing.wait_all_tasks_blocked()
        ((at, settings),) = runtimes.started
        assert at == welcome.at
        assert settings.node_id == node_id
        assert settings.namespace == "acme"  # the token's tenant
        assert settings.temporal == TEMPORAL
        # The queue is the node ID itself (`node-<hex>`), never `node-node-<hex>`.
        assert settings.task_queue == node_id and node_id.startswith("node-")
        assert settings.identity.data_dir == data
        assert reported_runtime(data) == "running"

        await trio.sleep(30)
        net.cluster.set_state(node_id, "blocked")
        blocked_at = trio.current_time()
        await trio.testing.wait_all_tasks_blocked()
        assert runtimes.stopped == [blocked_at]
        assert reported_runtime(data) == "stopped"
        await trio.sleep(20)
        assert len(runtimes.started) == 1, "no runtime while blocked"

        # The next stream's edge goes silent: three heartbeats later that stream ends.
        net.cluster.edges["edge-a:7443"].sends_heartbeats = False
        net.cluster.set_state(node_id, "accepted")
        again = await net.cluster.wait_for("welcome", 2)
        await trio.testing.wait_all_tasks_blocked()
        assert [at for at, _ in runtimes.started] == [welcome.at, again.at]
        assert reported_runtime(data) == "running"
        third = await net.cluster.wait_for("welcome", 3)
        assert runtimes.stopped[1] == pytest.approx(again.at + 15)
        await trio.testing.wait_all_tasks_blocked()
        assert [at for at, _ in runtimes.started][2] == third.at
        await trio.sleep(1)
        cancelled_at = trio.current_time()
        nursery.cancel_scope.cancel()
    # Cancelled (SIGTERM): the runtime of the live stream stopped with it, at once.
    assert runtimes.stopped[2:] == [cancelled_at]
    assert reported_runtime(data) == "stopped"


async def test_a_welcome_without_temporal_runs_no_runtime_and_warns_once(
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)
    caplog.clear()
    runtimes = FakeRuntimes(data)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data), runtimes.factory)
        await net.cluster.wait_for("welcome")
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert runtimes.started == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "named no Temporal frontend" in warnings[0] and "runs no runtime" in warnings[0]
    assert len(net.cluster.of_kind("welcome")) == 1, "the stream stayed up all along"


async def test_a_runtime_that_fails_is_retried_on_the_same_stream_with_growing_waits(
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)
    net.cluster.temporal = TEMPORAL
    runtimes = FakeRuntimes(data, failures=3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data), runtimes.factory)
        welcome = await net.cluster.wait_for("welcome")
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert [at - welcome.at for at, _ in runtimes.started] == pytest.approx([0, 2, 6, 14])
    assert len(net.cluster.of_kind("welcome")) == 1, "a failing runtime never ends the stream"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "Temporal unreachable; trying again in 2 s",
        "Temporal unreachable; trying again in 4 s",
        "Temporal unreachable; trying again in 8 s",
    ]
    assert len(runtimes.stopped) == 1


async def test_a_purge_stops_the_runtime_before_the_files_go(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.temporal = TEMPORAL
    runtimes = FakeRuntimes(data)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data), runtimes.factory)
        await net.cluster.wait_for("welcome")
        await trio.sleep(10)
        net.cluster.set_state(node_id, "purging")
        purged = await net.cluster.wait_for("purge-answer")
    assert purged.detail["type"] == "purged"
    assert runtimes.files_at_stop == [True]
    assert not data.exists()


# --- the real runtime, with nothing (or a mute listener) where Temporal should be ------


def identity_with_certificate(data: Path) -> IdentityDir:
    identity = IdentityDir(data)
    identity.create()
    ca = pki.new_ca("test", "cluster")
    key = identity.load_or_create_key()
    identity.save_ca(pki.cert_to_pem(ca.cert))
    identity.save_certificate(
        ca.issue(
            key.public_key(), name="node-0123456789ab", role=pki.Role.NODE, validity=dt.timedelta(1)
        )
    )
    return identity


def settings_for(identity: IdentityDir, temporal: str) -> RuntimeSettings:
    return RuntimeSettings(
        node_id="node-0123456789ab",
        namespace="default",
        temporal=temporal,
        identity=identity,
        cluster="test",
    )


async def test_a_runtime_that_cannot_reach_temporal_fails_and_is_never_running(
    tmp_path: Path,
) -> None:
    identity = identity_with_certificate(tmp_path / "node")
    # Nothing listens on port 1 of the test's own address.
    node_runtime = NodeRuntime(settings_for(identity, "127.0.0.61:1"))
    became_running: list[bool] = []
    with trio.fail_after(runtime.CONNECT_TIMEOUT + runtime.STOP_TIMEOUT):
        with pytest.raises(RuntimeFailed, match=r"127\.0\.0\.61:1 .*namespace default"):
            await node_runtime.run(lambda: became_running.append(True))
    assert became_running == []


async def test_cancelling_a_runtime_that_is_still_connecting_stops_it_at_once(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    identity = identity_with_certificate(tmp_path / "node")
    # A listener that accepts and never answers: the TLS handshake hangs.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.61")
    port = listeners[0].socket.getsockname()[1]
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    await nursery.start(trio.serve_listeners, hold, listeners)
    node_runtime = NodeRuntime(settings_for(identity, f"127.0.0.61:{port}"))
    with trio.move_on_after(1):
        await node_runtime.run(lambda: None)
    began = trio.current_time()
    await node_runtime.stop()
    assert held, "it was connecting"
    assert trio.current_time() - began < 1.0
    assert not [t for t in threading.enumerate() if t.name == node_runtime.thread_name]


def test_welcome_reads_temporal_and_tenant_and_ignores_fields_it_does_not_know() -> None:
    base = {"type": "welcome", "node_id": "node-1", "server": "server-1", "heartbeat": 5}
    welcome = Welcome.parse({**base, "temporal": "10.0.0.11:7233", "tenant": "acme", "x": 1}, "e")
    assert (welcome.temporal, welcome.tenant) == ("10.0.0.11:7233", "acme")
    older = Welcome.parse(base, "e")
    assert (older.temporal, older.tenant) == (None, None)
    with pytest.raises(ProtocolViolation, match="malformed temporal"):
        Welcome.parse({**base, "temporal": "no port here"}, "e")
