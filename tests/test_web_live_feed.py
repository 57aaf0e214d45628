"""What feeds the web UI's live updates, without a server: the hub's notifications wake
the streams watching a node (and lists for other nodes), and a node's connection changing
notifies `oz0_node_links` while the edge's heartbeat writes do not."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest

from fixtures.cluster import ClusterFiles
from fixtures.web_events import events
from oz0 import access, nodes
from oz0.store.events import NODE_LINKS, NODES, OPERATORS, EventHub
from oz0.store.listen import Notification
from oz0.web import live, live_others
from oz0.web.live import Feed, Stream

SERVER = "server-live-feed"
# The rights a stream was opened with (those of a cluster-wide viewer).
VIEWER = (access.Role.VIEWER, frozenset[str]())


@pytest.fixture
def heard() -> Iterator[tuple[EventHub, Feed]]:
    """A feed that hears a hub for the test's length (the hub itself listens to nothing)."""
    hub, feed = EventHub("unused: nothing here listens"), Feed()
    with feed.subscribed(hub):
        yield hub, feed


@pytest.mark.parametrize("channel", [NODES, NODE_LINKS])
def test_a_notification_wakes_the_streams_watching_that_node(
    channel: str, heard: tuple[EventHub, Feed]
) -> None:
    a = nodes.new_node_id()
    watching, elsewhere = (
        Stream(frozenset({a}), False, "t1", VIEWER),
        Stream(frozenset(), False, "t2", VIEWER),
    )
    hub, feed = heard
    feed.streams.update((watching, elsewhere))
    hub._dispatch(Notification(channel, a))
    assert watching.woken.is_set() and not watching.others_changed
    assert not elsewhere.woken.is_set()


def test_a_list_hears_of_nodes_it_does_not_show_and_a_gap_wakes_all(
    heard: tuple[EventHub, Feed],
) -> None:
    shown, other = nodes.new_node_id(), nodes.new_node_id()
    a_list, a_page = (
        Stream(frozenset({shown}), True, "t1", VIEWER),
        Stream(frozenset({shown}), False, "t2", VIEWER),
    )
    hub, feed = heard
    feed.streams.update((a_list, a_page))
    hub._dispatch(Notification(OPERATORS, other))
    assert not a_list.woken.is_set()  # not about nodes
    hub._dispatch(Notification(NODES, other))
    assert a_list.woken.is_set() and a_list.others_changed
    assert not a_page.woken.is_set()
    hub._gap()
    assert a_page.woken.is_set()


def test_a_list_of_some_tenants_is_woken_only_by_nodes_not_known_to_be_anothers(
    heard: tuple[EventHub, Feed],
) -> None:
    acme_viewer = (access.Role.VIEWER, frozenset({"acme"}))
    scoped, everyone = (
        Stream(frozenset(), True, "t1", acme_viewer),
        Stream(frozenset(), True, "t2", VIEWER),
    )
    hub, feed = heard
    feed.streams.update((scoped, everyone))
    theirs, unknown = nodes.new_node_id(), nodes.new_node_id()
    feed.changed.tenant_of[theirs] = "beta"
    hub._dispatch(Notification(NODES, theirs))
    assert not scoped.woken.is_set() and feed.changed.count == 0
    assert everyone.woken.is_set() and everyone.others_changed
    # Perhaps acme's: woken to read whose it is, never told outright.
    hub._dispatch(Notification(NODE_LINKS, unknown))
    assert scoped.woken.is_set() and not scoped.others_changed
    assert feed.changed.since(0) == ({unknown}, 1)


def test_the_window_of_changed_nodes_gives_each_list_what_came_since_it_looked() -> None:
    changed = live_others.Changed()
    first = [nodes.new_node_id() for _ in range(3)]
    for node_id in first:
        changed.note(node_id)
    assert changed.since(0) == (set(first), 3)
    assert changed.since(2) == ({first[2]}, 3)
    assert changed.since(3) == (set(), 3)
    # A list further behind than the window gets what it still holds.
    later = [nodes.new_node_id() for _ in range(live_others.KEPT)]
    for node_id in later:
        changed.note(node_id)
    assert changed.since(0) == (set(later), 3 + live_others.KEPT)
    assert changed.outside(later[0], {"acme"}) is False  # not known: perhaps acme's
    changed.tenant_of[later[0]] = "acme"
    assert not changed.outside(later[0], {"acme"}) and changed.outside(later[0], {"beta"})


async def test_a_stream_holds_its_slot_only_from_its_first_event_to_its_end() -> None:
    feed = Feed()
    stream = Stream(frozenset(), False, "a session", VIEWER)
    held = feed.held(stream, events())
    # The response made, its body not begun (a client gone before then): no slot taken.
    assert feed.streams == set()
    await held.aclose()
    assert feed.streams == set()
    # Begun, it holds one until it ends, however it ends.
    held = feed.held(stream, events())
    assert await anext(held) == b": an event\n\n"
    assert feed.streams == {stream}
    await held.aclose()
    assert feed.streams == set()


async def test_a_session_holds_at_most_its_share_of_the_streams() -> None:
    feed = Feed()
    mine = [Stream(frozenset(), False, "mine", VIEWER) for _ in range(live.MAX_STREAMS_PER_SESSION)]
    opened = [feed.held(s, events()) for s in mine]
    for held in opened:
        await anext(held)
    assert feed.full_for("mine") is not None
    assert feed.full_for("another") is None
    # One let in before the others took the last slot ends at once, holding none.
    late = feed.held(Stream(frozenset(), False, "mine", VIEWER), events())
    assert [event async for event in late] == []
    assert len(feed.streams) == live.MAX_STREAMS_PER_SESSION
    for held in opened:
        await held.aclose()
    assert feed.full_for("mine") is None


def test_the_connection_notifies_and_heartbeats_do_not(one_cluster: ClusterFiles) -> None:
    main = one_cluster.main_db
    with (
        psycopg.connect(main, autocommit=True) as listener,
        psycopg.connect(main, autocommit=True) as conn,
    ):
        conn.execute(
            "INSERT INTO servers (id, advertise, version) VALUES (%s, '127.0.0.1', 'test')",
            (SERVER,),
        )
        node_id = nodes.new_node_id()
        conn.execute(
            "INSERT INTO nodes (id, tenant, state, labels, public_key_sha256)"
            " VALUES (%s, 'default', 'accepted', '{}', %s)",
            (node_id, secrets.token_hex(32)),
        )
        listener.execute(f"LISTEN {NODE_LINKS}")

        def heard() -> list[str]:
            return [n.payload for n in listener.notifies(timeout=0.5)]

        nodes.connected(conn, node_id, SERVER)
        assert heard() == [node_id]
        nodes.seen(conn, [node_id], SERVER)
        nodes.seen(conn, [node_id], SERVER)
        assert heard() == []
        nodes.disconnected(conn, [node_id], SERVER)
        assert heard() == [node_id]
        nodes.disconnected(conn, [node_id], SERVER)  # already: no change, no news
        assert heard() == []
