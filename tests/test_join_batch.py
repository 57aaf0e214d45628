"""Joins with a token written in batches (oz0.joins, oz0.server.edge.join_batch): exactly
counted however many race, each join ending as it would have alone. The data layer runs
against the real PostgreSQL; the end-to-end test uses a real server on 127.0.0.224."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio
import trio.lowlevel
import trio.testing
from cryptography.hazmat.primitives import serialization

from fixtures import edge_client
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.cluster_db import uses
from fixtures.edge_client import NodeKeys
from oz0 import audit, joins, nodes, pki, tokens
from oz0.context import Context
from oz0.server.edge.common import DatabaseUnavailable
from oz0.server.edge.join_batch import JoinBatcher
from oz0.store.pool import Conn, open_database
from tests.conftest import CliRunner

ADMIN = audit.Actor("operator", "admin")
ADDRESS = "127.0.0.224"
EDGE = f"{ADDRESS}:7443"


CONN_CLUSTER = "cluster_files"


def new_token(
    conn: psycopg.Connection[Any], max_uses: int, labels: dict[str, str] | None = None
) -> tuple[tokens.JoinToken, str]:
    with conn.transaction():
        return tokens.create(
            conn, tenant="default", ttl=None, max_uses=max_uses, labels=labels or {},
            description="", actor=ADMIN,
        )  # fmt: skip


def csr() -> str:
    key = pki.new_private_key()
    return pki.make_csr(key, "node").public_bytes(serialization.Encoding.PEM).decode()


def request(token: str, csr_pem: str | None = None, **labels: str) -> joins.TokenJoin:
    return joins.TokenJoin(csr_pem or csr(), token, labels, "host")


def join_many(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority, batch: list[joins.TokenJoin]
) -> list[joins.Outcome]:
    with conn.transaction():
        return joins.join_many(conn, ca, batch)


def audited_joins(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT actor, target, details FROM audit_log WHERE action = 'node.join' ORDER BY id"
    ).fetchall()


def outcome_kind(outcome: joins.Outcome) -> str:
    if isinstance(outcome, nodes.Joined):
        return outcome.state
    if isinstance(outcome, tokens.TokenRefused):
        return outcome.reason
    return "again" if outcome is None else type(outcome).__name__


def test_a_batch_admits_exactly_the_uses_left_in_the_order_given(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    token, string = new_token(conn, max_uses=7, labels={"team": "data"})
    wrong_secret = token.id + ".not-the-secret"
    batch = [request(string, os="linux") for _ in range(30)]
    batch[3:3] = [request(wrong_secret), request("malformed")]
    outcomes = join_many(conn, ca, batch)

    kinds = [outcome_kind(o) for o in outcomes]
    assert kinds == ["accepted"] * 3 + ["unknown"] * 2 + ["accepted"] * 4 + ["used_up"] * 23
    assert uses(conn, token.id) == 7
    joined = [o for o in outcomes if isinstance(o, nodes.Joined)]
    for j in joined:
        node = nodes.get(conn, j.node_id)
        assert (node.state, node.tenant, node.token_id) == ("accepted", "default", token.id)
        assert node.labels == {"team": "data", "os": "linux"}
        assert j.certificate is not None
        assert pki.identity_of(pki.cert_from_pem(j.certificate.encode())).name == j.node_id
    assert [(a, t) for a, t, _ in audited_joins(conn)] == [
        (j.node_id, f"node:{j.node_id}") for j in joined
    ]
    assert audited_joins(conn)[0][2] == {
        "state": "accepted", "tenant": "default", "token_id": token.id, "hostname": "host",
    }  # fmt: skip


def test_keys_known_or_repeated_end_as_alone_and_use_no_token(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    token, string = new_token(conn, max_uses=0)
    first_csr = csr()
    first = join_many(conn, ca, [request(string, first_csr)])[0]
    assert isinstance(first, nodes.Joined)
    repeated_csr = csr()
    blocked_csr = csr()
    blocked = join_many(conn, ca, [request(string, blocked_csr)])[0]
    assert isinstance(blocked, nodes.Joined)
    with conn.transaction():
        nodes.block(conn, blocked.node_id, ADMIN, "test")
    before = uses(conn, token.id)

    # The known key is the node it is (its token not used again); a blocked node's key,
    # a bad request and bad labels are refused; a key twice in one batch waits for the
    # next, where it is that node.
    outcomes = join_many(
        conn,
        ca,
        [
            request(string, first_csr),
            request(string, blocked_csr),
            request(string, "not a csr"),
            joins.TokenJoin(csr(), string, {"BAD KEY": "x"}, "host"),
            request(string, repeated_csr),
            request(string, repeated_csr),
        ],
    )
    assert outcomes[0] == first
    assert isinstance(outcomes[1], nodes.NodeError) and "is blocked" in str(outcomes[1])
    assert isinstance(outcomes[2], nodes.NodeError)
    assert str(outcomes[2]).startswith("bad certificate request")
    assert isinstance(outcomes[3], nodes.NodeError) and "label key" in str(outcomes[3])
    assert isinstance(outcomes[4], nodes.Joined) and outcomes[5] is None
    assert uses(conn, token.id) == before + 1
    again = join_many(conn, ca, [request(string, repeated_csr)])[0]
    assert again == outcomes[4]
    assert uses(conn, token.id) == before + 1


def test_a_node_label_contradicting_its_tokens_is_refused_and_uses_nothing(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    token, string = new_token(conn, max_uses=0, labels={"role": "laptops", "team": "data"})
    outcomes = join_many(
        conn,
        ca,
        [
            request(string, role="db-prod"),
            request(string, role="db-prod", team="ops", os="linux"),
            request(string, role="laptops", os="linux"),
            request(string, zone="eu-1"),
        ],
    )

    # Refused with one line (the edge sends it, the agent prints it and exits), before
    # the token's use is counted.
    assert isinstance(outcomes[0], nodes.NodeError)
    assert str(outcomes[0]) == "label role=db-prod contradicts the token's role=laptops"
    assert isinstance(outcomes[1], nodes.NodeError)
    assert str(outcomes[1]) == (
        "label role=db-prod contradicts the token's role=laptops;"
        " label team=ops contradicts the token's team=data"
    )
    # The token's value again, and keys the token does not set, are the node's.
    same, extra = outcomes[2], outcomes[3]
    assert isinstance(same, nodes.Joined) and isinstance(extra, nodes.Joined)
    assert nodes.get(conn, same.node_id).labels == {
        "role": "laptops", "team": "data", "os": "linux",
    }  # fmt: skip
    assert nodes.get(conn, extra.node_id).labels == {
        "role": "laptops", "team": "data", "zone": "eu-1",
    }  # fmt: skip
    assert uses(conn, token.id) == 2


def test_labels_claimed_under_a_lock_refuse_that_join_alone_in_a_batch(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    with conn.transaction():
        locked, string = tokens.create(
            conn, tenant="default", ttl=None, max_uses=2, labels={"team": "data"},
            description="", actor=ADMIN, lock_labels=True,
        )  # fmt: skip
    _, free = new_token(conn, max_uses=0, labels={"team": "data"})
    batch = [request(string, zone="eu-1"), request(string, team="data"), request(string)]
    outcomes = join_many(conn, ca, [*batch, request(free, zone="eu-1")])
    refused = outcomes[0]
    assert isinstance(refused, nodes.LabelsRefused)
    assert (refused.labels, refused.token_id) == ({"zone": "eu-1"}, locked.id)
    # The use it did not spend is the third join's.
    for joined in outcomes[1:3]:
        assert isinstance(joined, nodes.Joined)
        assert nodes.get(conn, joined.node_id).labels == {"team": "data"}
    assert uses(conn, locked.id) == 2
    # The cluster's lock: every token's.
    conn.execute("UPDATE cluster_settings SET lock_node_labels = true")
    [unlocked_before, by_cluster] = join_many(conn, ca, [request(free), request(free, os="x")])
    assert isinstance(unlocked_before, nodes.Joined)
    assert isinstance(by_cluster, nodes.LabelsRefused)
    assert str(by_cluster).startswith("label os=x refused: this cluster gives")


def test_batches_racing_on_many_connections_admit_exactly_max_uses(
    cluster_files: ClusterFiles, conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    token, string = new_token(conn, max_uses=7)
    writers, each = 6, 5
    start = threading.Barrier(writers)
    lock = threading.Lock()
    kinds: Counter[str] = Counter()

    def write() -> None:
        batch = [request(string) for _ in range(each)]
        with psycopg.connect(cluster_files.main_db) as own:
            start.wait(timeout=30)
            outcomes = join_many(own, ca, batch)
        with lock:
            kinds.update(outcome_kind(o) for o in outcomes)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert kinds == {"accepted": 7, "used_up": 23}
    assert uses(conn, token.id) == 7
    assert len(audited_joins(conn)) == 7
    assert nodes.count_nodes(conn) == 7


async def test_joins_that_arrive_together_are_one_transaction(
    cluster_files: ClusterFiles, ca: pki.CertificateAuthority, conn: psycopg.Connection[Any]
) -> None:
    _, string = new_token(conn, max_uses=0)
    transactions: list[int] = []
    first_held = trio.Event()
    release = trio.Event()
    async with open_database(cluster_files.main_db) as db, trio.open_nursery() as nursery:

        async def transaction(work: Callable[[Conn], Any]) -> Any:
            transactions.append(0)
            if len(transactions) == 1:
                first_held.set()
                await release.wait()  # the joins that arrive meanwhile make the next batch
            return await db.transaction(work)

        batcher = JoinBatcher(transaction, lambda: ca)
        await nursery.start(batcher.run)
        answers: list[nodes.Joined] = []

        async def join() -> None:
            answers.append(await batcher.join(request(string)))

        async with trio.open_nursery() as joiners:
            joiners.start_soon(join)
            await first_held.wait()
            for _ in range(9):
                joiners.start_soon(join)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        nursery.cancel_scope.cancel()
    assert len(answers) == 10 and {a.state for a in answers} == {"accepted"}
    assert len(transactions) == 2, "the nine that waited were written together"


async def test_an_outage_fails_every_join_of_its_batch_and_the_next_batch_joins(
    ca: pki.CertificateAuthority, conn: psycopg.Connection[Any], cluster_files: ClusterFiles
) -> None:
    _, string = new_token(conn, max_uses=0)
    down = True
    async with open_database(cluster_files.main_db) as db, trio.open_nursery() as nursery:

        async def transaction(work: Callable[[Conn], Any]) -> Any:
            # The fault, injected: the edge's transaction in an outage.
            if down:
                await trio.lowlevel.checkpoint()
                raise DatabaseUnavailable
            return await db.transaction(work)

        batcher = JoinBatcher(transaction, lambda: ca)
        await nursery.start(batcher.run)
        failed: list[BaseException] = []

        async def join() -> None:
            try:
                await batcher.join(request(string))
            except DatabaseUnavailable as e:
                failed.append(e)

        with trio.fail_after(10):
            async with trio.open_nursery() as joiners:
                for _ in range(5):
                    joiners.start_soon(join)
            assert len(failed) == 5
            down = False
            joined = await batcher.join(request(string))
        assert joined.state == "accepted"
        nursery.cancel_scope.cancel()
    assert nodes.count_nodes(conn) == 1


@pytest.mark.slow
async def test_thirty_concurrent_joins_on_a_seven_use_token_make_exactly_seven_nodes(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    context = Context.load(cluster_files.context_path)
    dataclasses.replace(context, servers=(f"{ADDRESS}:8443",)).save()
    start_server(cluster_files, ADDRESS)
    created = await cli_async(
        cli, "token", "create", "--tenant", "default", "--max-uses", "7", "--json", env=cluster_env
    )
    token = created.json()["token"]
    ca_pem, _ = await edge_client.fetch_ca(EDGE)
    answers: list[dict[str, Any]] = []

    async def one() -> None:
        keys = NodeKeys.new()
        keys.ca_pem = ca_pem
        answers.append(await edge_client.join(EDGE, keys, token=token))

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for _ in range(30):
                nursery.start_soon(one)
    kinds = Counter(a.get("state") or a.get("message") for a in answers)
    assert kinds == {"accepted": 7, "join token used up": 23}, answers
    listed = (await cli_async(cli, "node", "list", "--json", env=cluster_env)).json()
    assert len(listed) == 7
    assert {n["id"] for n in listed} == {a["node_id"] for a in answers if "node_id" in a}
    listed_tokens = (await cli_async(cli, "token", "list", "--json", env=cluster_env)).json()
    assert listed_tokens[0]["uses"] == 7
    audited = await cli_async(
        cli, "audit", "list", "--action", "node.join", "--json", env=cluster_env
    )
    assert len(audited.json()) == 7
