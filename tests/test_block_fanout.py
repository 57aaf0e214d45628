"""A block issued through one server takes effect on another within two seconds, carried by
PostgreSQL's notification: the edges' reconcile backstop is slowed to once a minute here, so
a lost notification path fails the bound instead of hiding behind the backstop."""

from __future__ import annotations

import threading
import time

import pytest
import trio
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from fixtures import edge_client
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.edge_client import next_non_heartbeat
from fixtures.polling import seconds_until
from fixtures.temporal import (
    Credentials,
    access,
    connect,
    long_poll,
    node_credentials,
    operator_credentials,
    run_async,
)
from tests.conftest import CliRunner

EDGE_C, TEMPORAL_C = "127.0.0.13:7443", "127.0.0.13:7233"
# The product promises two seconds; a block usually lands in tens of milliseconds
# (bench/node_removal.py measures it). Asserting the promise itself, not the usual.
BOUND = 2.0
# Far beyond BOUND: only a notification can end the stream in time.
NO_RECONCILE = ("--reconcile-every", "60")
POLLER = "test-poller"  # the identity fixtures.temporal.long_poll polls with
# A queue's partitions in Temporal (its default count): a poll lands on any one of them.
PARTITIONS = 4


def pollers(address: str, creds: Credentials, queue: str) -> set[str]:
    """Who Temporal says is polling QUEUE's activity tasks now, over its partitions."""

    async def describe() -> set[str]:
        client = await connect(address, "default", creds)
        names = [queue] + [f"/_sys/{queue}/{n}" for n in range(1, PARTITIONS)]
        found: set[str] = set()
        for name in names:
            described = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace="default",
                    task_queue=TaskQueue(name=name),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                )
            )
            found.update(p.identity for p in described.pollers)
        return found

    return run_async(describe)


@pytest.mark.slow
async def test_a_block_through_server_a_notifies_server_c_to_close_stream_and_temporal(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    for address in ("127.0.0.11", "127.0.0.12", "127.0.0.13"):
        start_server(cluster_files, address, *NO_RECONCILE)
    token = await cli_async(
        cli, "token", "create", "--tenant", "default", "--json", env=cluster_env
    )
    keys = edge_client.NodeKeys.new()
    keys.ca_pem, _ = await edge_client.fetch_ca(EDGE_C)
    assert (await edge_client.join(EDGE_C, keys, token=token.json()["token"]))[
        "state"
    ] == "accepted"
    creds = node_credentials(keys.ca_pem, keys.cert_pem, keys.key)
    await trio.to_thread.run_sync(
        lambda: seconds_until(
            lambda: access(TEMPORAL_C, "default", creds) == "allowed", 15, "C allows the node"
        )
    )

    # A worker's long poll in flight on C when the block lands.
    poll: dict[str, object] = {}

    def poll_on_c() -> None:
        poll["result"] = run_async(lambda: long_poll(TEMPORAL_C, "default", creds, keys.node_id))
        poll["at"] = time.monotonic()

    poller = threading.Thread(target=poll_on_c, daemon=True)
    poller.start()
    # Temporal itself lists the poll among its queue's pollers: it reached Temporal (past
    # the host's checks) and is held open there, not somewhere on its way.
    operator = operator_credentials(cluster_files)
    await trio.to_thread.run_sync(
        lambda: seconds_until(
            lambda: POLLER in pollers(TEMPORAL_C, operator, keys.node_id),
            15,
            "Temporal lists the poll among its pollers",
        )
    )
    assert poller.is_alive(), "the poll is held open while there is no work"

    async with edge_client.control(EDGE_C, keys) as (ws, welcome):
        assert welcome["type"] == "welcome" and welcome["server"] != ""
        issued = time.monotonic()
        blocked = await cli_async(
            cli, "node", "block", keys.node_id, "--reason", "fan-out test", env=cluster_env
        )
        assert blocked.code == 0, blocked.err
        answered = time.monotonic() - issued
        with trio.fail_after(10):
            refusal = await next_non_heartbeat(ws)
        stream_closed = time.monotonic() - issued
    assert refusal["type"] == "refused" and refusal["code"] == "blocked"

    def refused_on_c() -> float:
        return seconds_until(
            lambda: access(TEMPORAL_C, "default", creds) == "denied", 10, "C denies the node"
        )

    # Measured from the moment the operator ran the command (its own round trip included).
    await trio.to_thread.run_sync(refused_on_c)
    temporal_refused = time.monotonic() - issued
    await trio.to_thread.run_sync(lambda: poller.join(10))
    # A long poll cut by the block ends empty (Temporal's answer to a cancelled poll) or
    # denied (the host's, when Temporal answered with an error); either way at the block,
    # not after its minute.
    assert poll["result"] in ("denied", "empty")
    poll_cancelled = float(str(poll["at"])) - issued

    print(
        f"block via A (CLI done in {answered * 1000:.0f} ms), node on C:"
        f" stream closed after {stream_closed * 1000:.0f} ms,"
        f" long poll cancelled after {poll_cancelled * 1000:.0f} ms,"
        f" new calls refused by {temporal_refused * 1000:.0f} ms"
    )
    assert stream_closed < BOUND
    assert poll_cancelled < BOUND
    assert temporal_refused < BOUND
    again = await trio.to_thread.run_sync(
        lambda: run_async(lambda: long_poll(TEMPORAL_C, "default", creds, keys.node_id))
    )
    assert again == "denied"
