"""Block, unblock, delete and purge against a real server, driven through the protocol.

The tests share one server (each joins nodes of its own and looks only at those), but for
the one that must see a block end a stream with the reconcile backstop out of the way: it
starts a server of its own on EDGE_B, with a cluster of its own."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from fixtures import edge_client, strangers
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, Served, StartServer
from fixtures.edge_client import NodeKeys, next_non_heartbeat, pinned_keys, verified_command
from tests.conftest import CliRunner

# The module's server (tests/conftest.py's `served`), and the one test's own.
ADVERTISE = "127.0.0.11"
EDGE_A = f"{ADVERTISE}:7443"
OWN_CLUSTER_ADVERTISE = "127.0.0.12"
EDGE_B = f"{OWN_CLUSTER_ADVERTISE}:7443"


async def accepted_node(
    cli: CliRunner, files: ClusterFiles, env: dict[str, str], edge: str = EDGE_A
) -> NodeKeys:
    token = await cli_async(cli, "token", "create", "--tenant", "default", "--json", env=env)
    keys = await pinned_keys(files, edge)
    joined = await edge_client.join(edge, keys, token=token.json()["token"])
    assert joined["state"] == "accepted"
    return keys


async def audit_of(cli: CliRunner, node_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    found = await cli_async(cli, "audit", "list", "--target", f"node:{node_id}", "--json", env=env)
    rows: list[dict[str, Any]] = found.json()
    return rows


async def closed(ws: WebSocketConnection) -> bool:
    try:
        await next_non_heartbeat(ws)
    except ConnectionClosed:
        return True
    return False


async def test_a_block_notifies_the_stream_to_end_and_unblock_lets_the_node_back(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    # The reconcile backstop once a minute: the notification alone must end the stream.
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE, "--reconcile-every", "60")
    keys = await accepted_node(cli, cluster_files, cluster_env, EDGE_B)
    async with edge_client.control(EDGE_B, keys) as (ws, welcome):
        assert welcome["type"] == "welcome"
        blocked = await cli_async(
            cli, "node", "block", keys.node_id, "--reason", "lost laptop", env=cluster_env
        )
        assert blocked.code == 0, blocked.err
        began = trio.current_time()
        with trio.fail_after(5):
            refusal = await next_non_heartbeat(ws)
        took = trio.current_time() - began
        assert refusal == {
            "type": "refused",
            "code": "blocked",
            "message": f"node {keys.node_id} is blocked",
        }
        assert await closed(ws)
        assert took < 2, f"ended {took:.2f}s after the block committed"
    async with edge_client.control(EDGE_B, keys) as (_, first):
        assert first["type"] == "refused" and first["code"] == "blocked"
    shown = (await cli_async(cli, "node", "show", keys.node_id, "--json", env=cluster_env)).json()
    assert shown["state"] == "blocked" and shown["reason"] == "lost laptop"

    unblocked = await cli_async(cli, "node", "unblock", keys.node_id, env=cluster_env)
    assert unblocked.code == 0 and "accepted" in unblocked.out
    async with edge_client.control(EDGE_B, keys) as (_, first):
        assert first["type"] == "welcome"
    actions = [(r["action"], r["details"]) for r in await audit_of(cli, keys.node_id, cluster_env)]
    assert actions[0] == ("node.unblock", {"now": "accepted"})
    assert actions[1] == ("node.block", {"reason": "lost laptop", "was": "accepted"})


async def test_bad_block_unblock_purge_and_delete_requests_change_nothing(
    cli: CliRunner,
    served: Served,
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await accepted_node(cli, cluster_files, cluster_env)
    node = keys.node_id
    cases = [
        (("node", "block", node), "--reason"),
        (("node", "block", node, "--reason", " "), "a reason is required"),
        (("node", "unblock", node), f"node {node} is accepted; only blocked nodes"),
        (("node", "purge", node), "add --yes"),
        (("node", "block", "node-000000000000", "--reason", "x"), "not found"),
        (("node", "delete", "nonsense"), "invalid node ID"),
    ]
    for args, message in cases:
        result = await cli_async(cli, *args, env=cluster_env)
        assert result.code != 0, args
        assert message in result.err and result.err.count("\n") == 1, (args, result.err)
    shown = (await cli_async(cli, "node", "show", node, "--json", env=cluster_env)).json()
    assert shown["state"] == "accepted"
    assert [r["action"] for r in await audit_of(cli, node, cluster_env)] == ["node.join"]

    # Blocked while pending: it never had a certificate, so no stream to purge it through.
    pending = await pinned_keys(cluster_files, EDGE_A)
    assert (await edge_client.join(EDGE_A, pending))["state"] == "pending"
    blocked = await cli_async(
        cli, "node", "block", pending.node_id, "--reason", "x", env=cluster_env
    )
    assert blocked.code == 0, blocked.err
    purge = await cli_async(cli, "node", "purge", pending.node_id, "--yes", env=cluster_env)
    assert purge.code == 1 and "no control stream" in purge.err
    unblocked = await cli_async(cli, "node", "unblock", pending.node_id, env=cluster_env)
    assert unblocked.code == 0 and "(pending)" in unblocked.out

    # A node that never comes back stays purging; delete forgets it.
    assert (await cli_async(cli, "node", "purge", node, "--yes", env=cluster_env)).code == 0
    # (The module's other tests' nodes are listed too: only purging ones, this among them.)
    listed = await cli_async(cli, "node", "list", "--state", "purging", "--json", env=cluster_env)
    assert node in [n["id"] for n in listed.json()]
    assert {n["state"] for n in listed.json()} == {"purging"}
    assert (await cli_async(cli, "node", "delete", node, env=cluster_env)).code == 0
    remaining = [
        n["id"] for n in (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json()
    ]
    assert node not in remaining and pending.node_id in remaining


async def test_a_lost_notification_still_ends_the_stream_within_two_seconds(
    cli: CliRunner,
    served: Served,
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await accepted_node(cli, cluster_files, cluster_env)
    async with edge_client.control(EDGE_A, keys) as (ws, welcome):
        assert welcome["type"] == "welcome"

        def block_silently() -> None:
            # As if the NOTIFY never arrived: triggers off for this one write.
            with psycopg.connect(cluster_files.main_db) as c:
                c.execute("SET session_replication_role = replica")
                c.execute("UPDATE nodes SET state = 'blocked' WHERE id = %s", (keys.node_id,))

        await trio.to_thread.run_sync(block_silently)
        began = trio.current_time()
        with trio.fail_after(5):
            refusal = await next_non_heartbeat(ws)
        took = trio.current_time() - began
    assert refusal["type"] == "refused" and refusal["code"] == "blocked"
    # The reconcile loop runs every second; the bound is two.
    assert took < 2.5, f"ended after {took:.2f}s"


async def test_delete_forgets_the_node_and_its_key_may_join_again_as_a_new_node(
    cli: CliRunner,
    served: Served,
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await accepted_node(cli, cluster_files, cluster_env)
    old_id = keys.node_id
    async with edge_client.control(EDGE_A, keys) as (ws, welcome):
        assert welcome["type"] == "welcome"
        deleted = await cli_async(cli, "node", "delete", old_id, env=cluster_env)
        assert deleted.code == 0, deleted.err
        with trio.fail_after(5):
            refusal = await next_non_heartbeat(ws)
        assert refusal["type"] == "refused" and refusal["code"] == "unknown"
    listed = (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json()
    assert old_id not in [n["id"] for n in listed]
    assert (await cli_async(cli, "node", "show", old_id, env=cluster_env)).code == 1

    again = await edge_client.join(EDGE_A, keys)
    assert again["type"] == "joined" and again["state"] == "pending"
    assert again["node_id"] != old_id
    history = [r["action"] for r in await audit_of(cli, old_id, cluster_env)]
    assert history == ["node.delete", "node.join"]


async def test_purge_of_a_connected_node_is_signed_and_forgets_it_once_answered(
    cli: CliRunner,
    served: Served,
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await accepted_node(cli, cluster_files, cluster_env)
    async with edge_client.connect(
        EDGE_A, "/control", edge_client.verified_context(keys.ca_pem, keys)
    ) as (ws, hello):
        assert (await edge_client.receive(ws))["type"] == "welcome"
        purging = await cli_async(cli, "node", "purge", keys.node_id, "--yes", env=cluster_env)
        assert purging.code == 0, purging.err
        with trio.fail_after(5):
            message = await next_non_heartbeat(ws)
        command = verified_command(message, keys.ca_pem)
        assert command["action"] == "purge"
        assert command["cluster"] == cluster_files.name and command["node_id"] == keys.node_id
        assert command["challenge"] == hello["challenge"] and len(command["nonce"]) == 32
        shown = (
            await cli_async(cli, "node", "show", keys.node_id, "--json", env=cluster_env)
        ).json()
        assert shown["state"] == "purging"
        await edge_client.send(ws, "purged", nonce=command["nonce"])
        assert await next_non_heartbeat(ws) == {"type": "forgotten", "node_id": keys.node_id}
    assert (await cli_async(cli, "node", "show", keys.node_id, env=cluster_env)).code == 1
    history = await audit_of(cli, keys.node_id, cluster_env)
    assert [r["action"] for r in history] == ["node.purged", "node.purge", "node.join"]
    assert history[0]["actor"]["kind"] == "node"
    assert history[0]["details"]["nonce"] == command["nonce"]


async def test_a_purge_waits_for_an_offline_node_and_a_refusal_is_audited(
    cli: CliRunner,
    served: Served,
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await accepted_node(cli, cluster_files, cluster_env)
    blocked = await cli_async(cli, "node", "block", keys.node_id, "--reason", "x", env=cluster_env)
    assert blocked.code == 0
    purging = await cli_async(cli, "node", "purge", keys.node_id, "--yes", env=cluster_env)
    assert purging.code == 0, purging.err
    again = await cli_async(cli, "node", "purge", keys.node_id, "--yes", env=cluster_env)
    assert again.code == 1 and "being purged already" in again.err

    nonces = []
    async with edge_client.control(EDGE_A, keys) as (ws, first):
        nonces.append(verified_command(first, keys.ca_pem)["nonce"])
        await edge_client.send(
            ws, "purge_refused", nonce=nonces[0], reason="testing a refusal\n" + "x" * 600
        )
        assert await edge_client.receive(ws) == {
            "type": "refused",
            "code": "purging",
            "message": f"node {keys.node_id} is purging",
        }
    async with edge_client.control(EDGE_A, keys) as (ws, first):
        command = verified_command(first, keys.ca_pem)
        nonces.append(command["nonce"])
        await edge_client.send(ws, "purged", nonce=command["nonce"])
        assert (await edge_client.receive(ws))["type"] == "forgotten"
    assert nonces[0] != nonces[1], "every delivery is signed afresh"
    history = await audit_of(cli, keys.node_id, cluster_env)
    assert [r["action"] for r in history] == [
        "node.purged",
        "node.purge.refused",
        "node.purge",
        "node.block",
        "node.join",
    ]
    # The node's word, kept as one bounded line.
    assert history[1]["details"]["reason"] == "testing a refusal?" + "x" * 482
    assert history[1]["details"]["nonce"] == nonces[0]


async def test_a_blocked_node_is_shown_gone_before_it_answers_our_close_frame(
    cli: CliRunner,
    served: Served,
) -> None:
    """A node that does not answer the edge's close frame keeps its socket a while (up to
    CLOSE_TIMEOUT); it is shown disconnected as soon as the edge ends its stream, not after
    (measured without it: 2.3-5.3 s after the close frame; with it: about 0.35 s)."""
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await accepted_node(cli, cluster_files, cluster_env)
    host, port = EDGE_A.split(":")
    ctx = edge_client.verified_context(keys.ca_pem, keys)
    stream = await strangers.open_tls(host, int(port), "127.0.0.1", ctx)
    deaf = strangers.DeafWebsocket(stream, host, "/control")
    main = cluster_files.main_db

    def server_of_node() -> str | None:
        with psycopg.connect(main) as conn:
            row = conn.execute("SELECT server FROM nodes WHERE id = %s", (keys.node_id,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    try:
        with trio.fail_after(10):
            await deaf.open()
            types = [json.loads(await deaf.next_text() or "{}")["type"] for _ in range(2)]
        assert types == ["hello", "welcome"]
        assert await trio.to_thread.run_sync(server_of_node) is not None
        blocked = await cli_async(
            cli, "node", "block", keys.node_id, "--reason", "deaf", env=cluster_env
        )
        assert blocked.code == 0, blocked.err
        with trio.fail_after(10):
            while (text := await deaf.next_text()) and json.loads(text)["type"] == "heartbeat":
                pass
            assert text is not None and json.loads(text)["code"] == "blocked"
            assert await deaf.next_text() is None, "the edge's close frame, left unanswered"
        ended = trio.current_time()
        for _ in range(100):
            if await trio.to_thread.run_sync(server_of_node) is None:
                break
            await trio.sleep(0.05)
        assert trio.current_time() - ended < 1.5
    finally:
        await trio.aclose_forcefully(stream)
