"""Subscriptions to the event hub (oz0/store/events.py) last as long as their owner's
block: a task that ends, returns, fails or is cancelled, is heard from no more, and the
hub holds nothing of it. No server: notifications and gaps are handed to the hub as its
LISTEN connection would (`_dispatch`, `_gap`), on Trio's mock clock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, cast

import pytest
import trio
import trio.testing

from oz0.server.api.common import ManagementState
from oz0.server.api.operator_cache import OperatorCache
from oz0.server.audit_follow import Followers
from oz0.server.edge.tracking import StreamReconciler
from oz0.server.https import Served
from oz0.server.management import OperatorConnections
from oz0.store.events import NODE_LINKS, NODES, OPERATORS, EventHub
from oz0.store.listen import Notification
from oz0.temporal.host_keeper import HostKeeper
from oz0.temporal.node_access import NodeAccessSync
from oz0.temporal.operator_access import OperatorAccessSync
from oz0.web.live import Feed


class Boom(Exception):
    pass


def test_a_subscription_hears_its_channels_and_gaps_only_while_its_block_runs() -> None:
    hub = EventHub("unused: nothing here listens")
    heard: list[str] = []
    with hub.subscription(
        NODES,
        NODE_LINKS,
        notified=lambda n: heard.append(n.payload),
        on_gap=lambda: heard.append("gap"),
    ) as held:
        assert hub.subscriptions == (held,)
        hub._dispatch(Notification(NODES, "a"))
        hub._dispatch(Notification(OPERATORS, "not-its-channel"))
        hub._dispatch(Notification(NODE_LINKS, "b"))
        hub._gap()
    hub._dispatch(Notification(NODES, "after"))
    hub._gap()
    assert heard == ["a", "b", "gap"]
    assert not hub.subscriptions


def test_a_subscription_to_channels_names_who_hears_them() -> None:
    with pytest.raises(ValueError, match="subscriber"), EventHub("unused").subscription(NODES):
        pass


async def _owner(hub: EventHub, ends: Callable[[], Awaitable[None]], heard: list[str]) -> None:
    with hub.subscription(OPERATORS, notified=lambda n: heard.append(n.payload)):
        await ends()


@pytest.mark.parametrize("how", ["returns", "raises", "is cancelled"])
async def test_a_subscription_ends_with_its_task_however_the_task_ends(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    hub = EventHub("unused")
    heard: list[str] = []
    began = trio.Event()

    async def ends() -> None:
        began.set()
        await trio.sleep(1)
        if how == "raises":
            raise Boom
        if how == "is cancelled":
            await trio.sleep_forever()

    expected: AbstractContextManager[Any] = (
        pytest.RaisesGroup(Boom) if how == "raises" else nullcontext()
    )
    with expected:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_owner, hub, ends, heard)
            await began.wait()
            hub._dispatch(Notification(OPERATORS, "while"))
            assert len(hub.subscriptions) == 1
            if how == "is cancelled":
                await trio.sleep(2)
                nursery.cancel_scope.cancel()
    hub._dispatch(Notification(OPERATORS, "after"))
    assert heard == ["while"]
    assert not hub.subscriptions


# The roles that hear the hub, each run until cancelled: none holds its subscription after.
# Nothing they are given is touched before a notification or a gap comes (none does here).
NONE: Any = None


def _reconciler(hub: EventHub) -> Callable[..., Awaitable[None]]:
    return StreamReconciler(NONE, hub).run


def _operator_connections(hub: EventHub) -> Callable[..., Awaitable[None]]:
    return OperatorConnections(cast(ManagementState, NONE), cast(Served, NONE), hub).run


def _blocking(subscribed: Callable[[], Any]) -> Callable[..., Awaitable[None]]:
    """A task that holds what SUBSCRIBED gives (a context manager) until cancelled."""

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with subscribed():
            task_status.started()
            await trio.sleep_forever()

    return run


def _temporal_syncs(hub: EventHub) -> Callable[..., Awaitable[None]]:
    host = cast(HostKeeper, NONE)
    nodes, operators = NodeAccessSync(NONE, hub, host), OperatorAccessSync(NONE, hub, host)

    @contextmanager
    def both() -> Any:
        # As the temporal role holds them (oz0/temporal/role.py).
        with ExitStack() as held:
            held.enter_context(nodes.subscribed())
            held.enter_context(operators.subscribed())
            yield

    return _blocking(both)


def _management_api(hub: EventHub) -> Callable[..., Awaitable[None]]:
    state = ManagementState(
        db=NONE, cluster=NONE, server_id="s", temporal=NONE, metrics=NONE, readiness=NONE,
        hub=hub, followers=Followers(), live_pages=Feed(), operator_cache=OperatorCache(),
    )  # fmt: skip
    return _blocking(state.subscribed)


@pytest.mark.parametrize(
    ("role", "held"),
    [
        (_reconciler, 1),
        (_operator_connections, 1),
        (_temporal_syncs, 2),
        # The operator cache, the audit log's streams, the live pages' streams.
        (_management_api, 3),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
async def test_each_role_holds_its_subscriptions_while_it_runs_and_none_after(
    role: Callable[[EventHub], Callable[..., Awaitable[None]]],
    held: int,
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = EventHub("unused")
    async with trio.open_nursery() as nursery:
        await nursery.start(role(hub))
        assert len(hub.subscriptions) == held
        nursery.cancel_scope.cancel()
    assert not hub.subscriptions
