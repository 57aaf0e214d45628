"""The node protocol's messages (docs/node-protocol.md), decoded and checked.

Each message is one JSON object with a `type`. What the edge sends is checked field by
field here, so the rest of the agent works with typed values; a malformed message is a
`ProtocolViolation` of that edge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from oz0_common import json_object
from oz0_common.addresses import host_port
from oz0_node import addresses
from oz0_node.errors import ProtocolViolation

Message = dict[str, object]


def decode(raw: str | bytes, source: str) -> Message:
    try:
        message = json_object.parse(raw)
    except json_object.NotAnObject:
        message = {}
    if not isinstance(message.get("type"), str):
        raise ProtocolViolation(f"edge {source} sent something that is not a protocol message")
    return message


def encode(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def kind(message: Message) -> str:
    value = message["type"]
    assert isinstance(value, str)  # decode() checked it
    return value


def text(message: Message, key: str, source: str) -> str:
    value = message.get(key)
    if not isinstance(value, str):
        raise ProtocolViolation(f"edge {source}: {kind(message)} has no {key}")
    return value


def optional_text(message: Message, key: str, source: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolViolation(f"edge {source}: {kind(message)} has a malformed {key}")
    return value


def edge_list(message: Message, source: str) -> list[str]:
    """The `edges` of MESSAGE that are valid addresses (an absent list is empty)."""
    value = message.get("edges", [])
    if not isinstance(value, list):
        raise ProtocolViolation(f"edge {source}: {kind(message)} has a malformed edges list")
    return addresses.merge([], (e for e in value if isinstance(e, str)))


def expect(message: Message, wanted: str, source: str) -> Message:
    if kind(message) != wanted:
        raise ProtocolViolation(f"edge {source} sent {kind(message)!r} where {wanted!r} belongs")
    return message


@dataclass(frozen=True)
class Hello:
    cluster: str
    ca_hash: str
    ca_pem: str
    challenge: str | None

    @classmethod
    def parse(cls, message: Message, source: str) -> Hello:
        expect(message, "hello", source)
        return cls(
            cluster=text(message, "cluster", source),
            ca_hash=text(message, "ca_hash", source),
            ca_pem=text(message, "ca_pem", source),
            challenge=optional_text(message, "challenge", source),
        )

    def challenge_bytes(self, source: str) -> bytes:
        try:
            challenge = bytes.fromhex(self.challenge or "")
        except ValueError:
            challenge = b""
        if len(challenge) != 32:
            raise ProtocolViolation(f"edge {source}: hello has no 64-hex-digit challenge")
        return challenge


@dataclass(frozen=True)
class Joined:
    node_id: str
    state: str
    tenant: str | None
    certificate: str | None
    edges: list[str]

    @classmethod
    def parse(cls, message: Message, source: str) -> Joined:
        return cls(
            node_id=text(message, "node_id", source),
            state=text(message, "state", source),
            tenant=optional_text(message, "tenant", source),
            certificate=optional_text(message, "certificate", source),
            edges=edge_list(message, source),
        )


@dataclass(frozen=True)
class Welcome:
    node_id: str
    server: str
    heartbeat: float
    edges: list[str]
    # Where the node's runtime connects, and its namespace; an older edge sends neither.
    temporal: str | None = None
    tenant: str | None = None

    @classmethod
    def parse(cls, message: Message, source: str) -> Welcome:
        heartbeat = message.get("heartbeat")
        if (
            isinstance(heartbeat, bool)
            or not isinstance(heartbeat, int | float)
            or not 0 < heartbeat <= 3600
        ):
            raise ProtocolViolation(f"edge {source}: welcome has no valid heartbeat interval")
        return cls(
            node_id=text(message, "node_id", source),
            server=text(message, "server", source),
            heartbeat=float(heartbeat),
            edges=edge_list(message, source),
            temporal=_address(message, "temporal", source),
            tenant=optional_text(message, "tenant", source) or None,
        )


def _address(message: Message, key: str, source: str) -> str | None:
    """An optional HOST:PORT field, in the form oz0_common.addresses.host_port spells it."""
    value = optional_text(message, key, source)
    if value is None:
        return None
    try:
        return host_port(*addresses.split(value))
    except ValueError as e:
        raise ProtocolViolation(
            f"edge {source}: {kind(message)} has a malformed {key}: {e}"
        ) from None


@dataclass(frozen=True)
class Refusal:
    """An `error` (join path) or `refused` (control path): a code and a message."""

    code: str
    message: str

    @classmethod
    def parse(cls, message: Message, source: str) -> Refusal:
        code = text(message, "code", source)
        return cls(code=code, message=optional_text(message, "message", source) or code)
