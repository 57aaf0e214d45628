from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import psycopg
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from fixtures import edge_client
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, Served, StartServer
from fixtures.edge_client import NodeKeys, pinned_keys
from fixtures.polling import trio_until
from fixtures.tls import as_our_client, assert_refused_at_tls
from oz0 import pki
from oz0.jobs import parts, store
from oz0.server.edge import attempts
from oz0.server.edge.common import Edge
from oz0.server.edge.metrics import EdgeMetrics
from oz0.server.edge.wire import Wire
from tests.conftest import CliRunner

# Most tests share the module's server (`served`) and look only at what they made; those
# that count what the whole cluster holds, or add a server to it, start a cluster of their
# own (`cluster_files`) on OWN_EDGE, and the second server on NEXT_EDGE.
ADVERTISE, OWN_CLUSTER_ADVERTISE, NEXT = "127.0.0.11", "127.0.0.13", "127.0.0.14"
EDGE_A, OWN_EDGE, NEXT_EDGE = (f"{a}:7443" for a in (ADVERTISE, OWN_CLUSTER_ADVERTISE, NEXT))


async def test_a_node_without_token_waits_and_picks_its_certificate_up_on_accept(
    cli: CliRunner, served: Served
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await pinned_keys(cluster_files, EDGE_A)
    answer = await edge_client.join(EDGE_A, keys, labels={"os": "linux"}, hostname="laptop-7")
    assert answer["type"] == "joined" and answer["state"] == "pending"
    assert answer["certificate"] is None and answer["tenant"] == "default"
    assert re.fullmatch(r"node-[0-9a-f]{12}", keys.node_id)
    assert answer["edges"] == [EDGE_A]

    pending = (
        await cli_async(cli, "node", "list", "--state", "pending", "--json", env=cluster_env)
    ).json()
    assert {n["state"] for n in pending} == {"pending"}
    (mine,) = [n for n in pending if n["id"] == keys.node_id]
    assert mine["labels"] == {"os": "linux"} and mine["hostname"] == "laptop-7"

    picked: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:

        async def wait_for_pickup() -> None:
            picked.update(await edge_client.pickup(EDGE_A, keys))

        nursery.start_soon(wait_for_pickup)
        await trio.sleep(1)
        assert not picked, "the edge holds a pending pickup open"
        accepted = await cli_async(cli, "node", "accept", keys.node_id, env=cluster_env)
        assert accepted.code == 0, accepted.err
        began = trio.current_time()
    assert picked["type"] == "joined" and picked["state"] == "accepted"
    assert trio.current_time() - began < 5, "picked up as soon as accepted"
    cert = pki.cert_from_pem(keys.cert_pem)
    assert pki.identity_of(cert).name == keys.node_id and pki.identity_of(cert).role == "node"

    async with edge_client.control(EDGE_A, keys) as (_, welcome):
        assert welcome["type"] == "welcome" and welcome["node_id"] == keys.node_id
        assert welcome["edges"] == [EDGE_A] and welcome["heartbeat"] == 5
        shown = (
            await cli_async(cli, "node", "show", keys.node_id, "--json", env=cluster_env)
        ).json()
        assert shown["connected"] is True and shown["server"] == welcome["server"]
        assert shown["state"] == "accepted" and shown["token_id"] is None
        for key in (
            "id",
            "state",
            "tenant",
            "labels",
            "connected",
            "server",
            "last_seen",
            "joined_at",
            "token_id",
            "reason",
        ):
            assert key in shown
    # The edge records stream ends in its next batch, within one heartbeat.
    with trio.fail_after(8):
        while True:
            shown = (
                await cli_async(cli, "node", "show", keys.node_id, "--json", env=cluster_env)
            ).json()
            if shown["connected"] is False:
                break
            await trio.sleep(0.5)
    assert shown["server"] is None

    audit = (
        await cli_async(
            cli, "audit", "list", "--target", f"node:{keys.node_id}", "--json", env=cluster_env
        )
    ).json()
    assert [(r["action"], r["actor"]["kind"]) for r in audit] == [
        ("node.accept", "operator"),
        ("node.join", "node"),
    ]


async def test_a_rejected_node_is_told_and_refused(cli: CliRunner, served: Served) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    keys = await pinned_keys(cluster_files, EDGE_A)
    await edge_client.join(EDGE_A, keys)
    rejected = await cli_async(
        cli, "node", "reject", keys.node_id, "--reason", "unknown laptop", env=cluster_env
    )
    assert rejected.code == 0, rejected.err
    answer = await edge_client.pickup(EDGE_A, keys)
    assert answer == {"type": "rejected", "reason": "unknown laptop"}
    again = await cli_async(cli, "node", "accept", keys.node_id, env=cluster_env)
    assert again.code == 1
    assert (
        again.err == f"error: node {keys.node_id} is rejected; only pending nodes can be accepted\n"
    )
    shown = (await cli_async(cli, "node", "show", keys.node_id, "--json", env=cluster_env)).json()
    assert shown["state"] == "rejected" and shown["reason"] == "unknown laptop"

    # A certificate for it (as if issued before) is refused on the control stream.
    keys.cert_pem = _cert_for(cluster_files, keys)
    async with edge_client.control(EDGE_A, keys) as (_, first):
        assert first["type"] == "refused" and first["code"] == "rejected"


def _cert_for(
    files: ClusterFiles,
    keys: NodeKeys,
    *,
    cluster: str | None = None,
    role: pki.Role = pki.Role.NODE,
) -> bytes:
    """A certificate for KEYS signed by the cluster CA; by default the node's own."""
    import psycopg

    from oz0 import cluster as cluster_mod

    with psycopg.connect(files.main_db) as conn:
        ca = cluster_mod.load(conn, pki.read_master_key(files.master_key)).cluster_ca
    if cluster is not None:
        ca = _NamingCA(ca.cert, ca.key, cluster)
    cert = ca.issue(
        keys.key.public_key(), name=keys.node_id, role=role, validity=pki.OPERATOR_VALIDITY
    )
    return pki.cert_to_pem(cert)


@dataclass(frozen=True)
class _NamingCA(pki.CertificateAuthority):
    """The real CA's certificate and key, putting another cluster's name in what it signs."""

    named: str = ""

    @property
    def cluster(self) -> str:
        return self.named


async def test_a_token_accepts_at_once_in_its_tenant_with_its_labels(
    cli: CliRunner, served: Served
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    assert (await cli_async(cli, "tenant", "create", "acme", env=cluster_env)).code == 0
    created = await cli_async(
        cli,
        "token",
        "create",
        "--tenant",
        "acme",
        "--max-uses",
        "2",
        "--label",
        "team=data",
        "--json",
        env=cluster_env,
    )
    assert created.code == 0, created.err
    token = created.json()["token"]
    keys = await pinned_keys(cluster_files, EDGE_A)
    # A label the token sets with another value: refused, the token's use kept.
    refused = await edge_client.join(EDGE_A, keys, token=token, labels={"team": "ops"})
    assert refused == {
        "type": "error",
        "code": "bad_request",
        "message": "label team=ops contradicts the token's team=data",
    }
    answer = await edge_client.join(
        EDGE_A, keys, token=token, labels={"team": "data", "os": "linux"}
    )
    assert answer["state"] == "accepted" and answer["tenant"] == "acme"
    pki.cert_from_pem(keys.cert_pem).verify_directly_issued_by(pki.cert_from_pem(keys.ca_pem))
    shown = (await cli_async(cli, "node", "show", keys.node_id, "--json", env=cluster_env)).json()
    assert shown["labels"] == {"team": "data", "os": "linux"}
    assert shown["token_id"] == created.json()["id"]
    async with edge_client.control(EDGE_A, keys) as (_, welcome):
        assert welcome["type"] == "welcome"

    # The same key asking again (its answer was lost) is the same node, and uses no token.
    first_id = keys.node_id
    again = await edge_client.join(EDGE_A, keys, token=token, labels={"os": "linux"})
    assert again["node_id"] == first_id and again["state"] == "accepted"
    tokens = (await cli_async(cli, "token", "list", "--json", env=cluster_env)).json()
    assert [t["uses"] for t in tokens if t["id"] == created.json()["id"]] == [1]
    listed = (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json()
    assert [n["id"] for n in listed if n["token_id"] == created.json()["id"]] == [first_id]


async def test_node_list_by_tenant_returns_exactly_that_tenants_nodes(
    cli: CliRunner, served: Served
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    # Tenants of its own: the module's other tests join nodes to default and acme.
    joined: dict[str, list[str]] = {"initech": [], "umbrella": []}
    for tenant, count in (("initech", 2), ("umbrella", 1)):
        assert (await cli_async(cli, "tenant", "create", tenant, env=cluster_env)).code == 0
        token = await cli_async(
            cli, "token", "create", "--tenant", tenant, "--max-uses", "0", "--json", env=cluster_env
        )
        for _ in range(count):
            keys = await pinned_keys(cluster_files, EDGE_A)
            answer = await edge_client.join(EDGE_A, keys, token=token.json()["token"])
            assert answer.get("tenant") == tenant, answer
            joined[tenant].append(keys.node_id)
    for tenant, ids in joined.items():
        listed = await cli_async(cli, "node", "list", "--tenant", tenant, "--json", env=cluster_env)
        assert sorted(n["id"] for n in listed.json()) == sorted(ids), tenant
        assert {n["tenant"] for n in listed.json()} == {tenant}
        table = await cli_async(cli, "node", "list", "--tenant", tenant, env=cluster_env)
        others = [i for t, group in joined.items() if t != tenant for i in group]
        assert all(i in table.out for i in ids) and not any(i in table.out for i in others)
        api = await trio.to_thread.run_sync(
            partial(api_get, cluster_files, f"/api/v1/nodes?tenant={tenant}")
        )
        assert sorted(n["id"] for n in api["nodes"]) == sorted(ids), tenant
    unknown = await cli_async(cli, "node", "list", "--tenant", "nobody", "--json", env=cluster_env)
    assert unknown.json() == []


def api_get(files: ClusterFiles, path: str) -> Any:
    """GET PATH from server A's management API with curl and the admin's certificate."""
    context = files.context_dir
    answer = subprocess.run(
        [
            "curl", "--silent", "--show-error", "--fail", "--max-time", "10",
            "--cacert", str(context / "ca.crt"),
            "--cert", str(context / "operator.crt"),
            "--key", str(context / "operator.key"),
            *as_our_client(f"https://{ADVERTISE}:8443{path}"),
        ],
        capture_output=True, text=True, check=True, timeout=15,
    )  # fmt: skip
    return json.loads(answer.stdout)


@pytest.mark.slow
async def test_twenty_concurrent_joins_on_a_five_use_token_make_exactly_five_nodes(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    created = await cli_async(
        cli, "token", "create", "--tenant", "default", "--max-uses", "5", "--json", env=cluster_env
    )
    token = created.json()["token"]
    ca_pem, _ = await edge_client.fetch_ca(OWN_EDGE)
    answers: list[dict[str, Any]] = []

    async def one() -> None:
        keys = NodeKeys.new()
        keys.ca_pem = ca_pem
        answers.append(await edge_client.join(OWN_EDGE, keys, token=token))

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(one)
    kinds = sorted(str(a.get("state") or a.get("message")) for a in answers)
    assert kinds == ["accepted"] * 5 + ["join token used up"] * 15
    nodes = (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json()
    assert len(nodes) == 5
    tokens = (await cli_async(cli, "token", "list", "--json", env=cluster_env)).json()
    assert tokens[0]["uses"] == 5
    refused = (
        await cli_async(
            cli, "audit", "list", "--action", "node.join.refused", "--json", env=cluster_env
        )
    ).json()
    assert len(refused) == 15


@pytest.mark.slow
async def test_one_key_joining_many_times_at_once_is_one_node_using_its_token_once(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    created = await cli_async(
        cli, "token", "create", "--tenant", "default", "--max-uses", "0", "--json", env=cluster_env
    )
    key = await pinned_keys(cluster_files, OWN_EDGE)
    answers: list[dict[str, Any]] = []

    async def one() -> None:
        copy = NodeKeys(key.key, key.ca_pem)
        answers.append(await edge_client.join(OWN_EDGE, copy, token=created.json()["token"]))

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(one)
    assert {a.get("type") for a in answers} == {"joined"}, answers
    assert len({a["node_id"] for a in answers}) == 1
    listed = (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json()
    assert len(listed) == 1
    tokens = (await cli_async(cli, "token", "list", "--json", env=cluster_env)).json()
    assert tokens[0]["uses"] == 1
    joins = await cli_async(
        cli, "audit", "list", "--action", "node.join", "--json", env=cluster_env
    )
    assert len(joins.json()) == 1

    # Deleting it from several operators at once: one delete, one audit row.
    node_id = listed[0]["id"]
    results = []

    async def delete() -> None:
        # --context: the runs share this process's environment, which each one sets and
        # restores as it starts and ends; the flag does not race.
        context = str(cluster_files.context_path)
        results.append(
            await cli_async(cli, "node", "delete", node_id, "--context", context, env=cluster_env)
        )

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(delete)
    assert sorted(r.code for r in results) == [0, 1, 1, 1]
    # The four run in threads of this process, sharing its captured stderr: which result
    # got which line is a race, what they printed between them is not.
    printed = "".join(r.err for r in results).splitlines()
    assert printed == [f"error: node {node_id} not found"] * 3, printed
    deletes = await cli_async(
        cli, "audit", "list", "--action", "node.delete", "--json", env=cluster_env
    )
    assert len(deletes.json()) == 1


async def test_revoked_and_unknown_tokens_are_refused_and_audited(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    created = (
        await cli_async(cli, "token", "create", "--tenant", "default", "--json", env=cluster_env)
    ).json()
    assert (await cli_async(cli, "token", "revoke", created["id"], env=cluster_env)).code == 0
    keys = await pinned_keys(cluster_files, OWN_EDGE)
    revoked = await edge_client.join(OWN_EDGE, keys, token=created["token"])
    assert revoked == {"type": "error", "code": "token_refused", "message": "join token revoked"}
    unknown = await edge_client.join(OWN_EDGE, keys, token="tok-000000000000.nope")
    assert unknown == {"type": "error", "code": "token_refused", "message": "join token refused"}
    rows = (
        await cli_async(
            cli, "audit", "list", "--action", "node.join.refused", "--json", env=cluster_env
        )
    ).json()
    assert [r["details"]["reason"] for r in rows] == ["unknown", "revoked"]
    assert (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json() == []


async def test_control_streams_refuse_unknown_and_foreign_certificates(
    cli: CliRunner, served: Served
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    known = await pinned_keys(cluster_files, EDGE_A)
    token = await cli_async(
        cli, "token", "create", "--tenant", "default", "--json", env=cluster_env
    )
    assert (await edge_client.join(EDGE_A, known, token=token.json()["token"]))["state"] == (
        "accepted"
    )

    keys = await pinned_keys(cluster_files, EDGE_A)
    keys.node_id = "node-00000000abcd"
    keys.cert_pem = _cert_for(cluster_files, keys)
    async with edge_client.control(EDGE_A, keys) as (_, first):
        assert first == {
            "type": "refused",
            "code": "unknown",
            "message": "node node-00000000abcd is unknown",
        }

    # Signed by this cluster's CA, but naming another cluster, or another role: both are
    # refused before the node is looked up, even though the node they name exists.
    not_a_node = {
        "type": "refused",
        "code": "unknown",
        "message": "a node certificate of this cluster is required",
    }
    impostors = [("elsewhere", pki.Role.NODE), (cluster_files.name, pki.Role.OPERATOR)]
    for cluster_name, role in impostors:
        impostor = NodeKeys.new()
        impostor.ca_pem = known.ca_pem
        impostor.node_id = known.node_id
        impostor.cert_pem = _cert_for(cluster_files, impostor, cluster=cluster_name, role=role)
        async with edge_client.control(EDGE_A, impostor) as (_, first):
            assert first == not_a_node, (cluster_name, role)

    # A CA that is not this cluster's, though it carries the same cluster name: TLS fails.
    foreign = pki.new_ca(cluster_files.name, "cluster")
    stranger = NodeKeys.new()
    stranger.ca_pem = keys.ca_pem
    stranger.cert_pem = pki.cert_to_pem(
        foreign.issue(
            stranger.key.public_key(),
            name=known.node_id,
            role=pki.Role.NODE,
            validity=pki.OPERATOR_VALIDITY,
        )
    )
    ctx = edge_client.verified_context(stranger.ca_pem, stranger)
    await trio.to_thread.run_sync(assert_refused_at_tls, ADVERTISE, 7443, ctx, "/control")

    # And the edge still serves the nodes it knows, and records how many attempts one
    # says it runs at once (placement's bound); what is not 1 to 256 it ignores.
    def max_jobs() -> int:
        with psycopg.connect(cluster_files.main_db) as c:
            row = c.execute("SELECT max_jobs FROM nodes WHERE id = %s", (known.node_id,)).fetchone()
        assert row is not None
        return int(row[0])

    assert max_jobs() == 4
    async with edge_client.control(EDGE_A, known) as (ws, first):
        assert first["type"] == "welcome" and first["node_id"] == known.node_id
        await ws.send_message(json.dumps({"type": "max_jobs", "max_jobs": 6}))
        await trio_until(lambda: max_jobs() == 6, 10, "max_jobs recorded", in_thread=True)
        for wrong in (0, 257, "7", True, None):
            await ws.send_message(json.dumps({"type": "max_jobs", "max_jobs": wrong}))
        await trio.sleep(1)
        assert await trio.to_thread.run_sync(max_jobs) == 6
        await ws.send_message(json.dumps({"type": "max_jobs", "max_jobs": 9}))
        await trio_until(lambda: max_jobs() == 9, 10, "the next max_jobs", in_thread=True)


@pytest.mark.slow
async def test_a_connected_node_learns_a_server_that_comes_up(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    created = (
        await cli_async(cli, "token", "create", "--tenant", "default", "--json", env=cluster_env)
    ).json()
    keys = await pinned_keys(cluster_files, OWN_EDGE)
    await edge_client.join(OWN_EDGE, keys, token=created["token"])
    async with edge_client.control(OWN_EDGE, keys) as (ws, welcome):
        assert welcome["edges"] == [OWN_EDGE]
        await trio.to_thread.run_sync(lambda: start_server(cluster_files, NEXT))
        with trio.fail_after(20):
            while True:
                message = await edge_client.receive(ws)
                await edge_client.send(ws, "heartbeat")
                if message["type"] == "edges":
                    break
        assert message["edges"] == [OWN_EDGE, NEXT_EDGE]


class StubStream:
    """What the edge sends one node (a stand-in for its websocket: the fault is Temporal's)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_message(self, text: str) -> None:
        self.sent.append(json.loads(text))


@dataclass
class SlowTemporalEdge:
    """The parts of an Edge that attempts.py uses: every attempt placed on its node and
    running (the database), and a Temporal that answers node-slow's calls only at their
    deadline (an injected fault) and the others' at once."""

    metrics: EdgeMetrics
    attempt_calls: trio.CapacityLimiter
    calls: list[str]
    row_work: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(100))

    async def transaction(
        self, work: Callable[..., Any]
    ) -> tuple[list[str], dict[str, float], set[tuple[str, int]]]:
        # Running, its lost-after unknown (heartbeated every BEAT_MIN), an activity (not
        # streamed: its heartbeats go to Temporal).
        return [store.RUNNING], {}, set()

    async def in_namespace(self, namespace: str, make: Any, within: float) -> list[str]:
        self.calls.append(namespace)
        if namespace == "slow":
            await trio.sleep(within)
            raise TimeoutError
        return ["running"]


async def test_a_slow_temporal_call_holds_up_no_other_stream_and_what_is_dropped_is_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = CollectorRegistry()
    metrics = EdgeMetrics(registry)
    edge = SlowTemporalEdge(metrics, trio.CapacityLimiter(2), [])
    alive = {"type": "attempt_alive", "attempts": [{"job": "job-0123456789ab", "attempt": 1}]}
    async with trio.open_nursery() as nursery:
        slow, quick, third = (
            attempts.NodeAttempts(
                cast(Edge, edge), cast(Wire, StubStream()), f"node-{n}", tenant, nursery
            )
            for n, tenant in (("a", "slow"), ("b", "quick"), ("c", "slow"))
        )
        began = trio.current_time()
        await slow.received(alive)
        await slow.received(alive)  # its first is still at Temporal: set aside
        for _ in range(3):
            await quick.received(alive)  # heartbeated at once, each time it is due
            await trio.sleep(attempts.BEAT_MIN)
        assert sorted(edge.calls) == ["quick", "quick", "quick", "slow"]
        assert trio.current_time() - began < 3 * attempts.BEAT_MIN + 0.5
        # The edge's two calls at once: node-a's, and node-c's that waits its deadline too.
        await third.received(alive)
        await quick.received(alive)  # no room left on the edge: set aside
        await trio.sleep(0.1)
        assert sorted(edge.calls) == ["quick", "quick", "quick", "slow", "slow"]
    # The calls that waited gave up at their deadline, and made room again.
    assert trio.current_time() - began == pytest.approx(
        3 * attempts.BEAT_MIN + attempts.CALL_TIMEOUT, abs=0.5
    )
    assert edge.attempt_calls.borrowed_tokens == 0
    assert registry.get_sample_value("oz0_edge_attempt_alives_dropped_total") == 2
    assert registry.get_sample_value("oz0_edge_attempt_calls_unavailable_total") == 2


@dataclass
class BatchedEndsEdge:
    """The parts of an Edge that a streamed part's attempt_done uses: its end written in a
    batch that takes GATHER to commit (part_ends.py), and no Temporal call left."""

    metrics: EdgeMetrics
    attempt_calls: trio.CapacityLimiter
    row_work: trio.CapacityLimiter
    recorded: list[parts.Report] = field(default_factory=list)

    @property
    def part_ends(self) -> BatchedEndsEdge:
        return self

    async def record(self, report: parts.Report) -> parts.Recorded:
        self.recorded.append(report)
        await trio.sleep(0.05)  # the batch's commit
        return parts.Recorded(parts.STORED, report.job_id, "default")

    def tell(self, recorded: parts.Recorded) -> None:
        pass


async def test_a_fan_outs_ends_at_once_are_all_written_not_refused_for_temporal_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Hundreds of nodes report their streamed parts' ends at once: each is a batched
    write, so none waits for the edge's few Temporal calls (ATTEMPT_CALLS, here none left)
    nor is answered `unavailable` to be sent again a second later."""
    registry = CollectorRegistry()
    edge = BatchedEndsEdge(
        EdgeMetrics(registry), trio.CapacityLimiter(1), trio.CapacityLimiter(500)
    )
    edge.attempt_calls.acquire_on_behalf_of_nowait(object())  # Temporal busy
    streams = [StubStream() for _ in range(300)]
    result = {"exit_code": 0, "ended_because": "exit"}
    async with trio.open_nursery() as nursery:
        for n, stream in enumerate(streams):
            node = attempts.NodeAttempts(
                cast(Edge, edge), cast(Wire, stream), f"node-{n}", "default", nursery
            )
            done = {"type": "attempt_done", "job": "job-0123456789ab", "attempt": n + 1}
            await node.received({**done, "result": result})
    acks = [m for s in streams for m in s.sent]
    assert len(acks) == 300 and all(m["stored"] is True for m in acks), acks[:3]
    assert len(edge.recorded) == 300 and edge.row_work.borrowed_tokens == 0
    assert registry.get_sample_value("oz0_edge_attempt_dones_refused_total") == 0


@dataclass
class StreamedRowsEdge:
    """The parts of an Edge that a streamed part's attempt_alive uses: its row, which says
    STATE (running until the test cancels its job), and no Temporal room at all."""

    metrics: EdgeMetrics
    attempt_calls: trio.CapacityLimiter
    row_work: trio.CapacityLimiter
    state: str = store.RUNNING

    async def transaction(
        self, work: Callable[..., Any]
    ) -> tuple[list[str], dict[str, float], set[tuple[str, int]]]:
        return [self.state], {}, {("job-0123456789ab", 1)}


async def test_a_streamed_parts_alive_is_read_from_its_row_without_temporal_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its attempt_alive is a read of its row: answered with `attempt_stop` once its job is
    cancelled, though every one of the edge's Temporal calls is taken, and never dropped."""
    registry = CollectorRegistry()
    edge = StreamedRowsEdge(EdgeMetrics(registry), trio.CapacityLimiter(1), trio.CapacityLimiter(8))
    edge.attempt_calls.acquire_on_behalf_of_nowait(object())  # Temporal busy
    alive = {"type": "attempt_alive", "attempts": [{"job": "job-0123456789ab", "attempt": 1}]}
    stream = StubStream()
    async with trio.open_nursery() as nursery:
        node = attempts.NodeAttempts(
            cast(Edge, edge), cast(Wire, stream), "node-a", "default", nursery
        )
        await node.received(alive)
        await trio.sleep(attempts.BEAT_MIN)
        edge.state = store.CANCELLED
        await node.received(alive)
        await trio.sleep(0.1)
    assert stream.sent == [
        {"type": "attempt_stop", "job": "job-0123456789ab", "attempt": 1, "why": "cancelled"}
    ]
    assert registry.get_sample_value("oz0_edge_attempt_alives_dropped_total") == 0
