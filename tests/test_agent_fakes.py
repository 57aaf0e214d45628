"""A fake cluster of edges for the node agent's tests (no test functions here).

It speaks docs/node-protocol.md over real TLS (certificates from `oz0.pki`) and real
websockets, on in-memory streams (`FakeNet.open_stream`, so tests can run on MockClock)
or on a TCP listener. It keeps its nodes in memory; tests accept, reject, block and purge
them, and read what happened (connections, joins, pickups, heartbeats, purge commands and
the answers to them) with Trio timestamps. It holds the CA key, so it signs purge commands
as the real edge does, and tests make it forge them.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import errno
import json
import random
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import trio
import trio.testing
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_server_stream

from oz0 import pki
from oz0.server.tls import server_context
from oz0_node import agent, join

GOOD_TOKEN = "good-token"
EXPIRED_TOKEN = "expired-token"


@dataclass
class FakeNode:
    key: ec.EllipticCurvePublicKey
    tenant: str
    state: str = "pending"
    certificate: str | None = None
    reason: str | None = None


@dataclass
class Event:
    kind: str
    edge: str
    at: float
    detail: Any = None


@dataclass
class EdgeSession:
    ws: WebSocketConnection
    edge: FakeEdge
    path: str
    challenge: bytes
    peer: x509.Certificate | None

    async def receive(self) -> dict[str, Any]:
        with trio.fail_after(60):
            message = json.loads(await self.ws.get_message())
        assert isinstance(message, dict)
        return message

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send_message(json.dumps({"type": kind, **fields}))


Handler = Callable[[EdgeSession], Awaitable[None]]
# The `purge` message (command and signature) an edge sends NODE_ID on a session.
PurgeSigner = Callable[[EdgeSession, str], dict[str, str]]


class FakeCluster:
    """The CA, the nodes and the edges; one registry shared by every edge, like PostgreSQL."""

    def __init__(self, name: str = "test") -> None:
        self.ca = pki.new_ca(name, "cluster")
        self.name = name
        self.nodes: dict[str, FakeNode] = {}
        self.edges: dict[str, FakeEdge] = {}
        self.events: list[Event] = []
        self.changed = trio.Event()
        self.heartbeat = 5.0
        self.pickup_hold = 30.0
        # Tests replace it to forge commands; the default signs a valid one, like the edge.
        self.purge_command: PurgeSigner = self.signed_purge
        # What the edge does after `purged`: confirm, say nothing (and hold), or close.
        self.after_purged: Literal["forgotten", "silence", "close"] = "forgotten"
        # The Temporal frontend every welcome names (with the node's tenant); None: an older
        # edge that names neither.
        self.temporal: str | None = None
        # Node certificates: how long they are valid, and what a `renew` gets: a new
        # certificate, a refusal, or the renewal done but its answer lost (stream closed).
        self.cert_validity = dt.timedelta(days=30)
        # "ended": the stream of the old key ended (`refused`, unknown) before the answer.
        self.renew_answer: Literal["renewed", "refused", "lost", "ended"] = "renewed"
        # How the edge answers each `job_output`: stored (as when PostgreSQL took it).
        self.job_output_ack: dict[str, Any] = {"stored": True, "reason": None}

    @property
    def ca_pem(self) -> bytes:
        return pki.cert_to_pem(self.ca.cert)

    @property
    def ca_hash(self) -> str:
        return pki.ca_hash(self.ca.cert)

    def add_edge(
        self,
        address: str,
        *,
        role: pki.Role = pki.Role.SERVER,
        ca: pki.CertificateAuthority | None = None,
    ) -> FakeEdge:
        edge = FakeEdge(self, address, role=role, ca=ca or self.ca)
        self.edges[address] = edge
        return edge

    def edge_addresses(self) -> list[str]:
        return sorted(self.edges)

    def record(self, kind: str, edge: str, detail: Any = None) -> None:
        self.events.append(Event(kind, edge, trio.current_time(), detail))
        self._touch()

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    async def wait_for(self, kind: str, count: int = 1, *, deadline: float = 600) -> Event:
        """The COUNTth event of KIND, waiting for it at most DEADLINE seconds (Trio clock)."""
        with trio.fail_after(deadline):
            while len(self.of_kind(kind)) < count:
                await self._wait_change()
        return self.of_kind(kind)[count - 1]

    async def _wait_change(self) -> None:
        await self.changed.wait()

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    # --- operator actions -------------------------------------------------------------

    def accept(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.state = "accepted"
        node.certificate = self.issue(node_id, node.key)
        self._touch()

    def issue(self, node_id: str, key: ec.EllipticCurvePublicKey) -> str:
        cert = self.ca.issue(key, name=node_id, role=pki.Role.NODE, validity=self.cert_validity)
        return pki.cert_to_pem(cert).decode()

    def reject(self, node_id: str, reason: str) -> None:
        self.nodes[node_id].state = "rejected"
        self.nodes[node_id].reason = reason
        self._touch()

    def set_state(self, node_id: str, state: str) -> None:
        self.nodes[node_id].state = state
        self._touch()

    # --- purge commands -------------------------------------------------------------------

    def purge_fields(self, s: EdgeSession, node_id: str, /, **changes: Any) -> dict[str, Any]:
        """A valid command for NODE_ID on session S, with CHANGES."""
        return {
            "action": "purge",
            "cluster": self.name,
            "node_id": node_id,
            "nonce": secrets.token_hex(16),
            "challenge": s.challenge.hex(),
            "issued_at": dt.datetime.now(dt.UTC).isoformat(),
            **changes,
        }

    def sign(
        self, fields: dict[str, Any] | bytes, key: ec.EllipticCurvePrivateKey | None = None
    ) -> dict[str, str]:
        """The `purge` message for FIELDS (or raw bytes), signed by KEY (the CA's)."""
        data = fields if isinstance(fields, bytes) else json.dumps(fields).encode()
        signature = (key or self.ca.key).sign(data, ec.ECDSA(hashes.SHA256()))
        return {
            "command": base64.b64encode(data).decode(),
            "signature": base64.b64encode(signature).decode(),
        }

    def signed_purge(self, s: EdgeSession, node_id: str) -> dict[str, str]:
        return self.sign(self.purge_fields(s, node_id))


class FakeEdge:
    def __init__(
        self,
        cluster: FakeCluster,
        address: str,
        *,
        role: pki.Role,
        ca: pki.CertificateAuthority,
    ) -> None:
        self.cluster = cluster
        self.address = address
        self.server_id = "server-" + address.partition(":")[0]
        key = pki.new_private_key()
        cert = ca.issue(
            key.public_key(),
            name=self.server_id,
            role=role,
            validity=dt.timedelta(days=7),
            sans=["127.0.0.1"],
            server=True,
        )
        self.tls = server_context(
            cluster.ca_pem,
            pki.cert_to_pem(cert),
            pki.key_to_pem(key),
            client_certs=ssl.CERT_OPTIONAL,
            tickets=0,
        )
        # Tests replace these to script an edge; the defaults behave like the real one.
        self.on_join: Handler = self.default_join
        self.on_control: Handler = self.default_control
        self.sends_heartbeats = True
        # A lying edge offers another CA in its hello than the one its certificate is from.
        self.hello_ca_pem: bytes | None = None

    async def serve(self, stream: trio.abc.Stream) -> None:
        tls = trio.SSLStream(stream, self.tls, server_side=True)
        try:
            await tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
            peer = x509.load_der_x509_certificate(der) if der else None
            async with trio.open_nursery() as nursery:
                request = await wrap_server_stream(nursery, tls)
                ws = await request.accept()
                challenge = secrets.token_bytes(32)
                session = EdgeSession(ws, self, request.path, challenge, peer)
                self.cluster.record("connect", self.address, request.path)
                await session.send(
                    "hello",
                    cluster=self.cluster.name,
                    ca_hash=self.cluster.ca_hash,
                    ca_pem=(self.hello_ca_pem or self.cluster.ca_pem).decode(),
                    challenge=challenge.hex(),
                )
                handler = self.on_join if request.path == "/join" else self.on_control
                await handler(session)
                await ws.aclose()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, ConnectionClosed, trio.TooSlowError):
            pass
        finally:
            self.cluster.record("closed", self.address)
            await trio.aclose_forcefully(tls)

    # --- /join --------------------------------------------------------------------------

    async def default_join(self, s: EdgeSession) -> None:
        cluster = self.cluster
        message = await s.receive()
        if message["type"] == "join":
            cluster.record("join", self.address, message)
            if message["token"] == EXPIRED_TOKEN:
                await s.send("error", code="token_refused", message="join token expired")
                return
            key = pki.csr_public_key(message["csr"].encode())
            node_id = "node-" + secrets.token_hex(6)
            tenant = "acme" if message["token"] == GOOD_TOKEN else "default"
            cluster.nodes[node_id] = FakeNode(key, tenant)
            if message["token"] == GOOD_TOKEN:
                cluster.accept(node_id)
            node = cluster.nodes[node_id]
            await s.send(
                "joined",
                node_id=node_id,
                state=node.state,
                tenant=tenant,
                certificate=node.certificate,
                edges=cluster.edge_addresses(),
            )
            return
        assert message["type"] == "pickup", message
        node_id = message["node_id"]
        cluster.record("pickup", self.address, node_id)
        found = cluster.nodes.get(node_id)
        if found is None:
            await s.send("error", code="unknown_node", message=f"node {node_id} not found")
            return
        try:
            found.key.verify(
                base64.b64decode(message["signature"]), s.challenge, ec.ECDSA(hashes.SHA256())
            )
        except InvalidSignature:
            cluster.record("bad-signature", self.address, node_id)
            await s.send("error", code="bad_request", message="signature does not verify")
            return
        with trio.move_on_after(cluster.pickup_hold):
            while found.state == "pending":
                await cluster._wait_change()
        if found.state == "accepted":
            await s.send(
                "joined",
                node_id=node_id,
                state="accepted",
                tenant=found.tenant,
                certificate=found.certificate,
                edges=cluster.edge_addresses(),
            )
        elif found.state == "rejected":
            await s.send("rejected", reason=found.reason)
        else:
            await s.send("pending")

    # --- /control -----------------------------------------------------------------------

    async def default_control(self, s: EdgeSession) -> None:
        cluster = self.cluster
        identity = pki.identity_of(s.peer) if s.peer is not None else None
        node = cluster.nodes.get(identity.name) if identity is not None else None
        if identity is None or identity.role != "node" or node is None:
            await s.send("refused", code="unknown", message="no node certificate")
            return
        assert s.peer is not None
        if s.peer.public_key().public_numbers() != node.key.public_numbers():  # as the edge
            cluster.record("old-key", self.address, identity.name)
            await s.send("refused", code="unknown", message="not this node's key")
            return
        if node.state == "purging":
            await self.purge(s, identity.name)
            return
        if node.state != "accepted":
            await self._refuse(s, identity.name, node.state)
            return
        await s.send(
            "welcome",
            node_id=identity.name,
            server=self.server_id,
            heartbeat=cluster.heartbeat,
            edges=cluster.edge_addresses(),
            **({"temporal": cluster.temporal, "tenant": node.tenant} if cluster.temporal else {}),
        )
        cluster.record("welcome", self.address, identity.name)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_from_node, s, nursery.cancel_scope)
            if self.sends_heartbeats:
                nursery.start_soon(self._send_heartbeats, s)
            while node.state == "accepted":
                await cluster._wait_change()
            nursery.cancel_scope.cancel()
        if node.state == "accepted":
            return  # the node closed the stream
        if node.state == "purging":
            await self.purge(s, identity.name)
        else:
            await self._refuse(s, identity.name, node.state)

    async def _refuse(self, s: EdgeSession, node_id: str, state: str) -> None:
        """As the real edge: `refused`, then a close with code 4403 (blocked, purging)."""
        await s.send("refused", code=state, message=f"node {node_id} is {state}")
        if state in ("blocked", "purging"):
            await s.ws.aclose(4403, state)

    async def purge(self, s: EdgeSession, node_id: str) -> None:
        """Send a purge command and act on the answer, as the real edge does."""
        cluster = self.cluster
        message = cluster.purge_command(s, node_id)
        cluster.record("purge-sent", self.address, message)
        await s.send("purge", **message)
        answer = await s.receive()
        while answer["type"] == "heartbeat":
            answer = await s.receive()
        cluster.record("purge-answer", self.address, answer)
        if answer["type"] != "purged":
            await self._refuse(s, node_id, "purging")
            return
        del cluster.nodes[node_id]
        cluster._touch()
        if cluster.after_purged == "forgotten":
            await s.send("forgotten", node_id=node_id)
        elif cluster.after_purged == "silence":
            while True:
                await s.ws.get_message()

    async def _send_heartbeats(self, s: EdgeSession) -> None:
        while True:
            await trio.sleep(self.cluster.heartbeat)
            await s.send("heartbeat")

    async def _receive_from_node(self, s: EdgeSession, scope: trio.CancelScope) -> None:
        try:
            while True:
                message = json.loads(await s.ws.get_message())
                self.cluster.record("from-node", self.address, message)
                if message["type"] == "renew":
                    await self._renew(s, message)
                elif message["type"] == "job_output":
                    await s.send(
                        "job_output_ack",
                        job=message["job"],
                        attempt=message["attempt"],
                        seq=message["seq"],
                        **self.cluster.job_output_ack,
                    )
        except ConnectionClosed:
            self.cluster.record("node-closed", self.address)
        scope.cancel()

    async def _renew(self, s: EdgeSession, message: dict[str, Any]) -> None:
        cluster = self.cluster
        assert s.peer is not None
        node_id = pki.identity_of(s.peer).name
        if cluster.renew_answer == "refused":
            await s.send("renew_refused", code="too_early", message="not yet")
            return
        node = cluster.nodes[node_id]
        node.key = pki.csr_public_key(message["csr"].encode())
        node.certificate = cluster.issue(node_id, node.key)
        cluster.record("renewed", self.address, node.certificate)
        if cluster.renew_answer == "lost":
            await s.ws.aclose()
            return
        if cluster.renew_answer == "ended":
            await self._refuse(s, node_id, "unknown")
            await s.ws.aclose()
            return
        await s.send("renewed", certificate=node.certificate)


class FakeNet:
    """Addresses to fake edges over in-memory streams; some addresses refuse connections."""

    def __init__(self, cluster: FakeCluster, nursery: trio.Nursery) -> None:
        self.cluster = cluster
        self.nursery = nursery
        self.down: set[str] = set()
        self.attempts: list[tuple[str, float]] = []

    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        address = f"{host}:{port}"
        self.attempts.append((address, trio.current_time()))
        edge = self.cluster.edges.get(address)
        if edge is None or address in self.down:
            raise OSError(errno.ECONNREFUSED, "Connection refused")
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(edge.serve, server)
        return client


def options(
    data_dir: Path,
    cluster: FakeCluster | None = None,
    *,
    edges: list[str] | None = None,
    ca_hash: str | None = None,
    token: str | None = None,
    labels: dict[str, str] | None = None,
) -> agent.StartOptions:
    return agent.StartOptions(
        data_dir=data_dir,
        edges=edges if edges is not None else (cluster.edge_addresses() if cluster else []),
        ca_hash=ca_hash if ca_hash is not None else (cluster.ca_hash if cluster else None),
        request=join.JoinRequest(token=token, labels=labels or {}, hostname="test-host"),
    )


class LongestWait(random.Random):
    """Jitter that always picks the upper bound, so waits are exact (and the longest)."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def run_agent(net: FakeNet, opts: agent.StartOptions) -> Any:
    """The agent until it ends (its outcome) or fails; never more than 1000 s of Trio time."""
    with trio.fail_after(1000):
        return await agent.run(opts, open_stream=net.open_stream, rng=LongestWait())


async def join_and_stop(net: FakeNet, data: Path, **option_fields: Any) -> str:
    """A node of NET's cluster in DATA, accepted (its agent stopped once welcomed); its ID.

    OPTION_FIELDS go to the agent's StartOptions (launcher, ...). Events are cleared."""
    opts = dataclasses.replace(options(data, net.cluster, token=GOOD_TOKEN), **option_fields)
    before = set(net.cluster.nodes)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, opts)
        await net.cluster.wait_for("welcome")
        nursery.cancel_scope.cancel()
    net.cluster.events.clear()
    net.attempts.clear()
    (node_id,) = set(net.cluster.nodes) - before
    return node_id


async def serve_fake_edge(cluster: FakeCluster, nursery: trio.Nursery) -> str:
    """An edge of CLUSTER on a real TCP listener on 127.0.0.1 (port 0); its address."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    edge = cluster.add_edge(f"127.0.0.1:{port}")
    await nursery.start(partial(trio.serve_listeners, edge.serve, listeners))
    return edge.address


def read_json(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    assert isinstance(raw, dict)
    return raw
