"""Joins with a token, many in one transaction: what the edge's join batcher writes.

A batch costs one lock of each token it presents, one statement each for the known keys,
the uses, the new nodes and their audit rows, and one commit, whatever its size. Each
join in it ends as it would have alone, in the order given: a key that is a node already
gets that node, a token admits exactly as many nodes as it has uses left, the rest are
refused with the reason `tokens.consume` gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from psycopg.types.json import Jsonb

from oz0 import audit, node_labels, nodes, pki, tokens
from oz0.errors import Oz0Error


@dataclass(frozen=True)
class TokenJoin:
    """One join message that presents a token (already checked by oz0.node_strings)."""

    csr_pem: str
    token: str
    labels: dict[str, str]
    hostname: str


# What became of one join: its node, or why not (tokens.TokenRefused, nodes.NodeError);
# None: its key is joining earlier in the same batch, so it waits for the next batch,
# where it finds that node.
Outcome = nodes.Joined | Oz0Error | None


@dataclass(frozen=True)
class _New:
    index: int
    node_id: str
    key: ec.EllipticCurvePublicKey
    sha256: str
    token: tokens.JoinToken
    labels: dict[str, str]
    hostname: str


def join_many(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority, requests: Sequence[TokenJoin]
) -> list[Outcome]:
    """Join REQUESTS in the caller's transaction; what became of each, in their order.

    Keys that two joins race to add make psycopg.errors.UniqueViolation at the insert (the
    other transaction committed first): the caller runs the batch again, which then finds
    those nodes as known keys.
    """
    outcomes: list[Outcome] = [None] * len(requests)
    keys: dict[int, tuple[ec.EllipticCurvePublicKey, str]] = {}
    batch_keys: set[str] = set()
    for i, request in enumerate(requests):
        try:
            key = pki.csr_public_key(request.csr_pem.encode())
        except ValueError as e:
            outcomes[i] = nodes.NodeError(f"bad certificate request: {e}")
            continue
        sha256 = nodes.public_key_sha256(key)
        if sha256 not in batch_keys:
            batch_keys.add(sha256)
            keys[i] = (key, sha256)
    if not keys:
        return outcomes

    known = {
        str(row[0]): row[1:]
        for row in conn.execute(
            "SELECT public_key_sha256, id, state, tenant, certificate FROM nodes"
            " WHERE public_key_sha256 = ANY(%s)",
            ([sha256 for _, sha256 in keys.values()],),
        )
    }
    joining: list[int] = []
    for i, (_, sha256) in keys.items():
        if sha256 in known:
            outcomes[i] = _rejoined(*known[sha256])
        else:
            joining.append(i)
    if not joining:
        return outcomes

    # Asked only when a node claims labels: the cluster may lock them to its token's.
    locked = any(requests[i].labels for i in joining) and node_labels.cluster_locked(conn)
    # The certificates are signed before the tokens are locked, for the joins an unlocked
    # read admits: the lock is then held for the statements and the commit only.
    strings = [requests[i].token for i in joining]
    unlocked_read = tokens.Ledger.lock(conn, strings, lock=False)
    signed = {
        n.index: (n, nodes.issue_certificate(ca, n.node_id, n.key))
        for n in _admitted(unlocked_read, requests, joining, keys, locked)
        if not isinstance(n, Oz0Error)
    }
    ledger = tokens.Ledger.lock(conn, strings)
    new: list[_New] = []
    certificates: list[str] = []
    admitted_all = _admitted(ledger, requests, joining, keys, locked)
    for i, admitted in zip(joining, admitted_all, strict=True):
        if isinstance(admitted, Oz0Error):
            outcomes[i] = admitted
            continue
        if i in signed:
            n, certificate = signed[i]
        else:
            # Admitted under the lock, so by the read before too (see Ledger.lock); signed
            # now all the same should that ever not hold.
            n, certificate = admitted, nodes.issue_certificate(ca, admitted.node_id, admitted.key)
        new.append(n)
        certificates.append(certificate)
    if not new:
        return outcomes

    ledger.write(conn)
    conn.execute(
        "INSERT INTO nodes (id, tenant, state, labels, hostname, token_id, public_key,"
        " public_key_sha256, certificate)"
        " SELECT id, tenant, 'accepted', labels, hostname, token_id, public_key,"
        " public_key_sha256, certificate FROM unnest(%s::text[], %s::text[], %s::jsonb[],"
        " %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])"
        " AS r(id, tenant, labels, hostname, token_id, public_key, public_key_sha256,"
        " certificate)",
        (
            [n.node_id for n in new],
            [n.token.tenant for n in new],
            [Jsonb(n.labels) for n in new],
            [n.hostname for n in new],
            [n.token.id for n in new],
            [_public_pem(n.key) for n in new],
            [n.sha256 for n in new],
            certificates,
        ),
    )
    audit.record_each(
        conn,
        "node.join",
        [
            (
                audit.Actor("node", n.node_id),
                f"node:{n.node_id}",
                {
                    "state": "accepted",
                    "tenant": n.token.tenant,
                    "token_id": n.token.id,
                    "hostname": n.hostname,
                },
            )
            for n in new
        ],
        tenants=[[n.token.tenant] for n in new],
    )
    for n, certificate in zip(new, certificates, strict=True):
        outcomes[n.index] = nodes.Joined(n.node_id, "accepted", n.token.tenant, certificate)
    return outcomes


def _admitted(
    ledger: tokens.Ledger,
    requests: Sequence[TokenJoin],
    joining: list[int],
    keys: dict[int, tuple[ec.EllipticCurvePublicKey, str]],
    cluster_locked: bool,
) -> list[_New | Oz0Error]:
    """For each join of JOINING, in order, its new node or why LEDGER refuses it; the uses
    are counted in LEDGER. CLUSTER_LOCKED: every token's nodes get its labels only."""
    out: list[_New | Oz0Error] = []
    for i in joining:
        request = requests[i]
        try:
            token = ledger.admits(request.token)
            labels = nodes.under_token(
                token.labels,
                nodes.check_labels(request.labels),
                locked_by=node_labels.locked_by(token.lock_labels, cluster_locked),
            )
        except nodes.LabelsRefused as e:
            e.token_id = token.id
            out.append(e)
            continue
        except Oz0Error as e:
            out.append(e)
            continue
        ledger.take(token)
        key, sha256 = keys[i]
        hostname = request.hostname[:253] if isinstance(request.hostname, str) else ""
        out.append(_New(i, nodes.new_node_id(), key, sha256, token, labels, hostname))
    return out


def _rejoined(node_id: str, state: str, tenant: str, certificate: str | None) -> Outcome:
    # As nodes.rejoin answers.
    if state not in ("pending", "accepted"):
        return nodes.NodeError(f"this key belongs to node {node_id}, which is {state}")
    return nodes.Joined(str(node_id), str(state), str(tenant), certificate)


def _public_pem(key: ec.EllipticCurvePublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
