"""Node certificates renewed by the agent over its control stream.

- when: the decision on injected times (pki.renewal_point, the agent's and the edge's share);
- the edge's transaction on real PostgreSQL with an injected `now`: only an accepted node
  holding the stream's key, from half its validity on, with a key new to the cluster;
- the agent against a fake edge on MockClock, with a wall clock that follows Trio's: it
  asks at two thirds, installs the pair, reconnects with it; a lost answer is picked up;
  an expired certificate stops it with what to do; a crash mid-install is completed;
- end to end: a real server whose node certificates last 18 s (OZ0_NODE_CERT_VALIDITY)
  and a real agent that renews, reconnects with the new certificate and runs its runtime
  again, while the old certificate is refused (127.0.0.92).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fixtures import edge_client
from fixtures.agent import AgentProcess
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.edge_client import NodeKeys
from fixtures.fake_edges import FakeCluster, FakeNet, LongestWait, join_and_stop
from fixtures.polling import trio_until
from oz0 import audit, nodes, pki
from oz0.server.edge import renew as edge_renew
from oz0_node import agent, status
from oz0_node import main as node_main
from oz0_node.errors import AgentError
from oz0_node.identity import IdentityDir, NodeRecord
from tests.conftest import CliRunner

SERVER = "127.0.0.92"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
YEAR = dt.timedelta(days=365)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
OPERATOR = audit.Actor("operator", "admin")


# --- when ----------------------------------------------------------------------------


def _cert(validity: dt.timedelta, now: dt.datetime = T0) -> Any:
    ca = pki.new_ca("test", "cluster", now=now - dt.timedelta(days=1))
    key = pki.new_private_key().public_key()
    return ca.issue(key, name="node-0123456789ab", role=pki.Role.NODE, validity=validity, now=now)


def test_a_year_long_certificate_is_renewed_from_two_thirds_and_granted_from_half() -> None:
    cert = _cert(YEAR)
    assert pki.issued_at(cert) == T0
    assert cert.not_valid_after_utc == T0 + YEAR
    assert pki.renewal_point(cert, pki.NODE_RENEW_AT) == T0 + YEAR * 2 / 3
    assert pki.renewal_point(cert, pki.NODE_RENEW_EARLIEST) == T0 + YEAR / 2
    assert pki.NODE_VALIDITY == YEAR
    # The backdating for clock drift does not count: a 30 s certificate renews at 20 s.
    short = _cert(dt.timedelta(seconds=30))
    assert pki.renewal_point(short, pki.NODE_RENEW_AT) == T0 + dt.timedelta(seconds=20)


def test_node_validity_is_a_year_unless_tuned(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(pki.NODE_VALIDITY_ENV, raising=False)
    assert pki.node_validity() == YEAR
    monkeypatch.setenv(pki.NODE_VALIDITY_ENV, "30")
    assert pki.node_validity() == dt.timedelta(seconds=30)
    for bad in ("soon", "5", "-30"):
        monkeypatch.setenv(pki.NODE_VALIDITY_ENV, bad)
        caplog.clear()
        assert pki.node_validity() == YEAR
        assert f"ignoring {pki.NODE_VALIDITY_ENV}={bad!r}" in caplog.text


def test_status_reports_validity_renewal_point_and_expiry(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    cert = _cert(YEAR)
    identity.save_certificate(cert)
    fresh = status.certificate_report(identity, "node-0123456789ab", now=T0)
    assert fresh == {
        "not_after": (T0 + YEAR).isoformat(),
        "renew_from": (T0 + YEAR * 2 / 3).isoformat(),
        "expired": False,
        "advice": None,
    }
    late = status.certificate_report(identity, "node-0123456789ab", now=T0 + YEAR)
    assert late is not None and late["expired"] is True
    advice = str(late["advice"])
    assert "orchestrator-zero node delete node-0123456789ab" in advice
    assert "new --data-dir" in advice and "--token-file or OZ0_JOIN_TOKEN" in advice


@pytest.mark.parametrize("expired", [False, True])
def test_oz0_node_status_prints_the_certificate_and_what_to_do_once_expired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], expired: bool
) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    identity.save_record(
        NodeRecord(cluster="test", ca_hash="sha256:" + "a" * 64, node_id="node-0123456789ab")
    )
    issued = pki.utcnow() - (dt.timedelta(days=2) if expired else dt.timedelta(0))
    cert = _cert(dt.timedelta(days=1), now=issued)
    identity.save_certificate(cert)
    assert node_main.run(["status", "--data-dir", str(identity.data_dir)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("certificate:")]
    not_after = cert.not_valid_after_utc.isoformat()
    if expired:
        assert line.startswith(
            f"certificate: EXPIRED: the certificate of node node-0123456789ab expired at "
            f"{not_after}"
        )
        assert "orchestrator-zero node delete node-0123456789ab" in line
    else:
        renew_from = pki.renewal_point(cert, pki.NODE_RENEW_AT).isoformat()
        assert line == f"certificate: valid until {not_after}, renewal due from {renew_from}"


# --- the edge's transaction ------------------------------------------------------------


CONN_CLUSTER = "cluster_files"


def _csr(key: ec.EllipticCurvePrivateKey) -> str:
    return pki.make_csr(key, "node").public_bytes(serialization.Encoding.PEM).decode()


def _accepted(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> tuple[str, ec.EllipticCurvePrivateKey]:
    key = pki.new_private_key()
    with conn.transaction():
        joined = nodes.join(conn, ca, csr_pem=_csr(key), labels={}, hostname="h")
        nodes.accept(conn, ca, joined.node_id, OPERATOR)
    return joined.node_id, key


def _renew(
    conn: psycopg.Connection[Any],
    ca: pki.CertificateAuthority,
    node_id: str,
    key: ec.EllipticCurvePrivateKey,
    new_key: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
) -> str:
    with conn.transaction():
        return edge_renew.renew(
            conn,
            ca=ca,
            node_id=node_id,
            key=key.public_key(),
            csr_pem=_csr(new_key),
            server_id="srv-1",
            now=now,
        )


def _row(conn: psycopg.Connection[Any], node_id: str) -> tuple[str, str]:
    row = conn.execute(
        "SELECT public_key_sha256, certificate FROM nodes WHERE id = %s", (node_id,)
    ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def _renewals(conn: psycopg.Connection[Any], node_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT actor_kind, actor, details FROM audit_log WHERE action = 'node.renew'"
        " AND target = %s ORDER BY id",
        (f"node:{node_id}",),
    ).fetchall()
    return [{"actor": (r[0], r[1]), **r[2]} for r in rows]


def test_the_edge_renews_an_accepted_node_from_half_its_validity_with_a_new_key(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    node_id, key = _accepted(conn, ca)
    before = _row(conn, node_id)
    issued = pki.issued_at(pki.cert_from_pem(before[1].encode()))
    new_key = pki.new_private_key()

    with pytest.raises(edge_renew.RenewRefused) as early:
        _renew(conn, ca, node_id, key, new_key, issued + YEAR / 2 - dt.timedelta(minutes=1))
    assert early.value.code == "too_early"
    with pytest.raises(edge_renew.RenewRefused) as same:
        _renew(conn, ca, node_id, key, key, issued + YEAR / 2)
    assert same.value.code == "bad_request"
    assert _row(conn, node_id) == before and _renewals(conn, node_id) == []

    now = issued + YEAR / 2
    pem = _renew(conn, ca, node_id, key, new_key, now)
    cert = pki.cert_from_pem(pem.encode())
    cert.verify_directly_issued_by(ca.cert)
    assert pki.identity_of(cert).name == node_id and pki.identity_of(cert).role == "node"
    assert cert.public_key() == new_key.public_key()
    assert cert.not_valid_after_utc == now + YEAR
    assert _row(conn, node_id) == (nodes.public_key_sha256(new_key.public_key()), pem)
    assert nodes.control_state(conn, node_id, new_key.public_key()) is not None
    assert nodes.control_state(conn, node_id, key.public_key()) is None
    (renewal,) = _renewals(conn, node_id)
    assert renewal["actor"] == ("node", node_id) and renewal["server"] == "srv-1"
    assert renewal["serial"] == format(cert.serial_number, "x")

    # The old key has nothing left to renew.
    with pytest.raises(edge_renew.RenewRefused) as old:
        _renew(conn, ca, node_id, key, pki.new_private_key(), now + YEAR)
    assert old.value.code == "unknown"


def test_a_key_another_node_holds_is_refused(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority
) -> None:
    node_id, key = _accepted(conn, ca)
    _, other_key = _accepted(conn, ca)
    with pytest.raises(edge_renew.RenewRefused) as taken:
        _renew(conn, ca, node_id, key, other_key, pki.utcnow() + YEAR / 2)
    assert taken.value.code == "bad_request"


@pytest.mark.parametrize("state", ["blocked", "purging", "deleted"])
def test_a_blocked_purging_or_deleted_node_cannot_renew(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority, state: str
) -> None:
    node_id, key = _accepted(conn, ca)
    with conn.transaction():
        if state == "blocked":
            nodes.block(conn, node_id, OPERATOR, "test")
        elif state == "purging":
            nodes.purge(conn, node_id, OPERATOR)
        else:
            nodes.delete(conn, node_id, OPERATOR)
    with pytest.raises(edge_renew.RenewRefused) as refused:
        _renew(conn, ca, node_id, key, pki.new_private_key(), pki.utcnow() + YEAR / 2)
    assert refused.value.code == ("unknown" if state == "deleted" else state)
    assert _renewals(conn, node_id) == []


# --- the agent, on MockClock --------------------------------------------------------------


@pytest.fixture
async def net(nursery: trio.Nursery) -> AsyncIterator[FakeNet]:
    fake = FakeCluster()
    fake.add_edge("edge-a:7443")
    fake.cert_validity = dt.timedelta(minutes=10)
    yield FakeNet(fake, nursery)


def _trio_wall_clock() -> Callable[[], dt.datetime]:
    """Wall time that moves with Trio's clock (MockClock jumps it)."""
    wall, start = pki.utcnow(), trio.current_time()
    return lambda: wall + dt.timedelta(seconds=trio.current_time() - start)


async def _run(net: FakeNet, data: Path, clock: Callable[[], dt.datetime]) -> Any:
    with trio.fail_after(5000):
        return await agent.run(
            agent.StartOptions(data_dir=data), open_stream=net.open_stream, rng=LongestWait(),
            clock=clock,
        )  # fmt: skip


def _public(pem: bytes) -> ec.EllipticCurvePublicKey:
    key = pki.cert_from_pem(pem).public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


async def test_the_agent_renews_at_two_thirds_installs_the_pair_and_reconnects_with_it(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    identity = IdentityDir(data)
    old_cert = identity.load_certificate()
    clock = _trio_wall_clock()
    due_in = (pki.renewal_point(old_cert, pki.NODE_RENEW_AT) - clock()).total_seconds()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, net, data, clock)
        first = await net.cluster.wait_for("welcome")
        renewed = await net.cluster.wait_for("renewed")
        second = await net.cluster.wait_for("welcome", 2)
        nursery.cancel_scope.cancel()
    requests = [e for e in net.cluster.of_kind("from-node") if e.detail["type"] == "renew"]
    assert len(requests) == 1
    assert requests[0].at == pytest.approx(first.at + due_in, abs=1)
    # Installed: node.crt is what the edge issued, node.key its key, nothing staged left.
    assert identity.cert_path.read_bytes().decode() == renewed.detail
    new_key = pki.key_from_pem(identity.key_path.read_bytes())
    assert _public(identity.cert_path.read_bytes()) == new_key.public_key()
    assert net.cluster.nodes[node_id].key == new_key.public_key()
    assert not identity.next_key_path.exists() and not identity.next_cert_path.exists()
    assert oct(identity.key_path.stat().st_mode & 0o777) == "0o600"
    assert oct(identity.cert_path.stat().st_mode & 0o777) == "0o600"
    # At once on the same edge, with the new certificate (the fake refuses an old key).
    assert second.edge == first.edge and second.at - renewed.at < 1
    assert net.cluster.of_kind("old-key") == []


async def test_a_refused_renewal_is_asked_again_on_the_next_stream(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)
    net.cluster.renew_answer = "refused"
    clock = _trio_wall_clock()
    cert_before = IdentityDir(data).cert_path.read_bytes()
    # Streams end every 15 s (an edge that sends no heartbeats): a refused renewal is asked
    # again on the next one, not an hour later.
    net.cluster.edges["edge-a:7443"].sends_heartbeats = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, net, data, clock)
        while len([e for e in net.cluster.of_kind("from-node") if e.detail["type"] == "renew"]) < 2:
            await net.cluster.wait_for("from-node", len(net.cluster.of_kind("from-node")) + 1)
        nursery.cancel_scope.cancel()
    requests = [e for e in net.cluster.of_kind("from-node") if e.detail["type"] == "renew"]
    welcomes = [e.at for e in net.cluster.of_kind("welcome")]
    assert requests[1].at - requests[0].at < 30  # the next stream, not RETRY_ON_STREAM
    assert min(abs(requests[1].at - w) for w in welcomes) < 0.5
    assert IdentityDir(data).cert_path.read_bytes() == cert_before


@pytest.mark.parametrize("lost", ["lost", "ended"])
async def test_a_renewal_whose_answer_was_lost_is_picked_up_with_the_next_key(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock, lost: Any
) -> None:
    # "ended": the edge ended the old certificate's stream (`refused`, unknown: the key
    # changed) before its answer, as every stream of a renewed-away certificate is ended.
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.renew_answer = lost
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, net, data, _trio_wall_clock())
        renewed = await net.cluster.wait_for("renewed")
        net.cluster.renew_answer = "renewed"
        await net.cluster.wait_for("welcome", 2)
        nursery.cancel_scope.cancel()
    identity = IdentityDir(data)
    # The old certificate was refused once, then the pickup brought the renewed one.
    assert len(net.cluster.of_kind("old-key")) == 1
    assert [e.detail for e in net.cluster.of_kind("pickup")] == [node_id]
    assert identity.cert_path.read_bytes().decode() == renewed.detail
    assert not identity.next_key_path.exists()


async def test_an_expired_certificate_stops_the_agent_saying_what_to_do(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: Any
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    after = IdentityDir(data).load_certificate().not_valid_after_utc
    with pytest.raises(AgentError) as stopped:
        await _run(net, data, lambda: after)
    message = str(stopped.value)
    assert message.startswith(f"the certificate of node {node_id} expired at {after.isoformat()}")
    assert f"orchestrator-zero node delete {node_id}" in message
    assert message in caplog.text  # logged too
    assert net.cluster.of_kind("welcome") == []


@pytest.mark.parametrize("crashed_after", ["next_cert_written", "key_moved"])
def test_an_installation_a_crash_interrupted_is_completed_at_start(
    tmp_path: Path, crashed_after: str
) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    identity.load_or_create_key()
    next_key = identity.next_key()
    fake = FakeCluster()
    cert = pki.cert_from_pem(fake.issue("node-0123456789ab", next_key.public_key()).encode())
    identity.save_certificate(_cert(YEAR))
    (identity.root / "node.crt.next").write_bytes(pki.cert_to_pem(cert))
    if crashed_after == "key_moved":
        identity.next_key_path.replace(identity.key_path)
    identity.finish_renewal()
    assert pki.key_from_pem(identity.key_path.read_bytes()).public_key() == next_key.public_key()
    assert identity.load_certificate() == cert
    assert not identity.next_key_path.exists() and not identity.next_cert_path.exists()


# --- end to end ------------------------------------------------------------------------


# What the agent process writes (status.json, its files) is polled: there is no event.
# Each wait is bounded by the whole scenario's 120 s.
SCENARIO_BOUND = 120
# The real server's node certificates (OZ0_NODE_CERT_VALIDITY, seconds): renewed at two
# thirds (12 s), which leaves the agent time to join and start its runtime first, and the
# old certificate 6 s of validity in which its refusal is the renewal's doing. (30 s, as
# this was, waited 8 s longer for the same.)
E2E_VALIDITY = 18


async def test_a_real_agent_renews_and_reconnects_with_the_new_certificate(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(pki.NODE_VALIDITY_ENV, str(E2E_VALIDITY))
    start_server(cluster_files, SERVER)
    created = await cli_async(
        cli, "token", "create", "--tenant", "default", "--json", env=cluster_env
    )
    process = AgentProcess.joining(
        tmp_path / "node", [EDGE], cluster_files.ca_hash, token=created.json()["token"]
    ).start()
    agents.append(process)
    identity = IdentityDir(process.data_dir)
    with trio.fail_after(SCENARIO_BOUND):
        await trio_until(
            lambda: process.reported().get("runtime") == "running",
            SCENARIO_BOUND,
            "the agent's runtime running",
        )
        node_id = str(process.reported()["node_id"])
        first_pem = identity.cert_path.read_bytes()
        first = pki.cert_from_pem(first_pem)
        first_key = identity.key_path.read_bytes()
        validity = dt.timedelta(seconds=E2E_VALIDITY)
        assert first.not_valid_after_utc - pki.issued_at(first) == validity

        # Renewed at two thirds: a new key and certificate, which the cluster holds too.
        await trio_until(
            lambda: identity.cert_path.read_bytes() != first_pem,
            SCENARIO_BOUND,
            "a renewed certificate on disk",
        )
        renewed_at = time.monotonic()
        second_pem = identity.cert_path.read_bytes()
        second = pki.cert_from_pem(second_pem)
        assert identity.key_path.read_bytes() != first_key
        assert second.not_valid_after_utc > first.not_valid_after_utc
        # The old certificate (still valid for some seconds) opens no control stream.
        old = NodeKeys(pki.key_from_pem(first_key), ca_pem=identity.ca_path.read_bytes())
        old.cert_pem, old.node_id = first_pem, node_id
        async with edge_client.control(EDGE, old) as (_, answer):
            assert answer["type"] == "refused" and answer["code"] == "unknown"
        shown = await cli_async(
            cli, "audit", "list", "--action", "node.renew", "--json", env=cluster_env
        )
        assert shown.code == 0, shown.err
        assert {e["target"] for e in shown.json()} == {f"node:{node_id}"}

        # Reconnected with the new one, and its runtime runs again (restarted with the stream).
        await trio_until(
            lambda: process.log().count("node runtime working on") >= 2,
            SCENARIO_BOUND,
            "the runtime working a second time",
        )
        await trio_until(
            lambda: (
                bool(process.reported().get("connected"))
                and process.reported().get("runtime") == "running"
            ),
            SCENARIO_BOUND,
            "the agent connected again with its runtime running",
        )
        assert time.monotonic() - renewed_at < 15
        assert process.log().count("control stream up") >= 2
        listed = await cli_async(cli, "node", "show", node_id, "--json", env=cluster_env)
        assert listed.json()["connected"] is True
    log = process.log()
    assert "installed the renewed node certificate" in log
    # Either `renewed` arrived on the stream, or the stream ended first (the edge closes a
    # stream whose node's key changed) and the next connection picked the renewal up.
    assert "reconnecting with it" in log or "completed a renewal; reconnecting" in log
    assert "Traceback" not in log
