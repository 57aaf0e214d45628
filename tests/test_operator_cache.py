"""The management API's cache of operator certificates found current (operator_cache.py):
on Trio's mock clock, and against a real server on 127.0.0.221 whose operator is re-issued
by `server operator issue` while its old certificate is in use."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from cli.client import ApiClient, ApiError
from fixtures.cluster import ClusterFiles, ServerProcess, initialise
from oz0 import pki
from oz0.context import Context
from oz0.server.api.operator_cache import HOLD_FOR, OperatorCache
from oz0.server.events import NODES, OPERATORS, EventHub
from oz0.store.dburl import DatabaseUrl
from oz0.store.listen import Notification
from tests.conftest import CliRunner

StartServer = Callable[..., ServerProcess]
SERVER = "127.0.0.221"


def identity(name: str = "alice", serial: int = 7, days: float = 30) -> pki.Identity:
    not_after = pki.utcnow() + dt.timedelta(days=days)
    return pki.Identity(pki.Role.OPERATOR, name, "test", serial, not_after)


def attached() -> tuple[OperatorCache, EventHub]:
    hub = EventHub("unused")
    cache = OperatorCache()
    cache.attach(hub)
    return cache, hub


async def test_a_certificate_found_current_is_taken_again_for_hold_for_seconds_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cache, _ = attached()
    alice = identity()
    assert not cache.current(alice)
    cache.remember(alice, cache.version("alice"))
    began = trio.current_time()
    assert cache.current(alice)
    assert not cache.current(identity(serial=8)), "another certificate of the same name"
    assert not cache.current(identity(name="bob")), "another operator with the same serial"
    await trio.sleep(HOLD_FOR - 0.01)
    assert cache.current(alice)
    await trio.sleep(0.01)
    assert trio.current_time() - began == HOLD_FOR
    assert not cache.current(alice), "kept past HOLD_FOR"


async def test_an_operator_notification_or_a_listen_gap_forgets_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cache, hub = attached()
    alice, bob = identity(), identity(name="bob", serial=9)
    for who in (alice, bob):
        cache.remember(who, cache.version(who.name))
    hub._dispatch(Notification(NODES, "alice"))  # another channel: no change
    assert cache.current(alice)
    hub._dispatch(Notification(OPERATORS, "alice"))  # alice renewed or was re-issued
    assert not cache.current(alice)
    assert cache.current(bob), "only the operator that changed is forgotten"
    hub._gap()  # notifications may have been lost: forget everyone
    assert not cache.current(bob)


async def test_a_read_that_began_before_a_change_is_not_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cache, hub = attached()
    alice = identity()
    version = cache.version("alice")  # the database read starts ...
    hub._dispatch(Notification(OPERATORS, "alice"))  # ... the renewal commits meanwhile
    cache.remember(alice, version)  # ... and the read's answer comes back
    assert not cache.current(alice)
    version = cache.version("alice")
    hub._gap()
    cache.remember(alice, version)
    assert not cache.current(alice)
    cache.remember(alice, cache.version("alice"))
    assert cache.current(alice)


async def test_an_expired_certificate_is_never_taken_from_the_cache(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cache, _ = attached()
    expiring = identity(days=-1 / 86400)
    cache.remember(expiring, cache.version("alice"))
    assert not cache.current(expiring)


@pytest.fixture
def cluster_files(tmp_path: Path, pg_url: DatabaseUrl) -> ClusterFiles:
    return initialise(tmp_path, pg_url, advertise=SERVER)


def test_a_reissued_operator_s_old_certificate_is_refused_at_once_though_it_was_cached(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    tmp_path: Path,
) -> None:
    start_server(cluster_files, SERVER)
    old = tmp_path / "old-context"
    shutil.copytree(cluster_files.context_dir, old)
    client = ApiClient(Context.load(old / "context.json"), learn_servers=False)
    # The old certificate in use until the re-issue returns, so that the server always
    # has it cached (taken within the last HOLD_FOR) when the change commits.
    issued = threading.Event()

    def keep_calling() -> None:
        while not issued.is_set():
            try:
                client.get("/api/v1/cluster")
            except ApiError:
                return  # the change has reached the server

    client.get("/api/v1/cluster")  # cached from here on
    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        # `server operator issue` writes the database directly: no server hears of it but
        # through the notification.
        result = cli(
            "server", "operator", "issue", "admin",
            "--master-key-file", str(cluster_files.master_key),
            "--operator-dir", str(cluster_files.context_dir), "--advertise", SERVER,
            env=cluster_env,
        )  # fmt: skip
    finally:
        issued.set()
        caller.join(30)
    assert result.code == 0, result.err
    with pytest.raises(ApiError, match="unknown or this certificate was replaced"):
        client.get("/api/v1/cluster")
    assert cli("cluster", "info", env=cluster_env).code == 0, "the new certificate works"
