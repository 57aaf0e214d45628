"""What a server's edge makes of the notifications about nodes (oz0/store/events.py): the
news each carries (migration 0013), whether it is newer than what a stream read, and what
a watch of one node hears between its waits."""

from __future__ import annotations

import trio

from oz0.store.events import NODES, EventHub, NodeNews
from oz0.store.listen import Notification

NODE = "node-00000000002a"
KEY = "9f" * 32


def news(state: str, revision: int, key: str | None = KEY) -> Notification:
    return Notification(NODES, f"{NODE} {state} {key or '-'} {revision}")


def test_a_payload_parses_to_its_node_and_news_and_an_id_alone_to_no_news() -> None:
    assert NodeNews.parse(news("blocked", 12).payload) == (
        NODE,
        NodeNews(NODE, "blocked", KEY, 12),
    )
    assert NodeNews.parse(news("pending", 3, key=None).payload) == (
        NODE,
        NodeNews(NODE, "pending", None, 3),
    )
    assert NodeNews.parse(NODE) == (NODE, None)
    assert NodeNews.parse(f"{NODE} blocked {KEY} twelve") == (f"{NODE} blocked {KEY} twelve", None)


def test_news_counts_only_when_newer_than_the_read_and_for_the_key_of_the_stream() -> None:
    blocked = NodeNews(NODE, "blocked", KEY, 12)
    assert blocked.newer_than(11)
    assert not blocked.newer_than(12)  # what the stream read already
    assert not blocked.newer_than(13)  # an older commit, heard late
    deleted = NodeNews(NODE, "deleted", KEY, 12)
    assert deleted.newer_than(12)  # the very row the stream read, gone since
    assert not deleted.newer_than(13)
    assert blocked.state_for(KEY) == "blocked"
    assert blocked.state_for("00" * 32) is None  # the ID now holds another key
    assert deleted.state_for(KEY) is None


async def test_a_watch_hears_every_notification_between_its_waits_latest_news_first() -> None:
    hub = EventHub("")
    heard: list[str] = []
    with hub.subscription(NODES, notified=lambda n: heard.append(n.payload)):
        with hub.watch_node(NODE, wake_on_gap=False) as watch:
            hub._dispatch(news("blocked", 5))
            hub._dispatch(news("accepted", 6))
            assert await watch.wait() == NodeNews(NODE, "accepted", KEY, 6)
            # Still watched after a wait: nothing said between two waits is lost.
            hub._dispatch(news("purging", 7))
            assert await watch.wait() == NodeNews(NODE, "purging", KEY, 7)
            # A wake without news (the reconcile found the node changed) leaves only a read
            # to tell the state, whichever came first.
            hub._dispatch(news("blocked", 8))
            hub.wake(NODE)
            assert await watch.wait() is None
            hub.wake(NODE)
            hub._dispatch(news("blocked", 9))
            assert await watch.wait() is None
            with trio.move_on_after(0.01) as waited:
                await watch.wait()
            assert waited.cancelled_caught, "no wake since the last wait"
        hub._dispatch(news("blocked", 10))  # unwatched: nobody left to wake
    assert heard == [NODE] * 6  # subscribers hear the node's ID


async def test_a_gap_wakes_the_watches_that_asked_for_it_without_news() -> None:
    hub = EventHub("")
    with hub.watch_node(NODE) as hearing, hub.watch_node(NODE, wake_on_gap=False) as deaf:
        hub._gap()
        assert await hearing.wait() is None
        with trio.move_on_after(0.01) as waited:
            await deaf.wait()
        assert waited.cancelled_caught
