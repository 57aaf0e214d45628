"""Purge: check a signed purge command, remember its nonce, and delete the node's files.

The conversation with the edge (`purged` or `purge_refused`, then waiting for `forgotten`)
is `commands.answer_purge`; this module holds what it decides with and what comes after.

A command is refused unless all of these hold, checked in this order, each failure one
reason sent back to the edge: the message carries base64 `command` and `signature`; the
signature verifies with the cluster CA certificate in the node's own identity (never the
one an edge offers in `hello`); the command is a JSON object with action `purge` and a
nonce of 32 hex digits; it names this node's cluster, this node, and the challenge of
the connection it arrived on; its nonce was not seen before; and the data directory can
be deleted safely (below; once found unsafe, never again in this process). Every nonce
of a command whose signature verifies counts as seen, whatever else is wrong with that
command: it is the cluster's, so it never comes back.
Seen nonces stay in memory and in DIR/purge-nonces (0600, the last MAX_NONCES).

The data directory is deleted only if it is a real directory (not a symbolic link), this
platform's `shutil.rmtree` never follows symbolic links (`avoids_symlink_attacks`), and
it holds a node identity whose node ID is the one the command names. These are checked
before the agent answers `purged`, so a directory that would not be deleted refuses the
purge (the operator sees the reason in the audit log, and the node's files stay), and again,
re-reading the identity from disk, right before deleting; failing then, nothing is deleted
and the agent stops with an error. Symbolic links inside the directory are removed, never
followed. The directories above the data directory that the agent made for it are
removed too, each only if empty. The launcher (the file that starts the agent) is deleted
when it is a regular file or a symbolic link (the link itself); a directory or anything
else is left alone.
"""

from __future__ import annotations

import base64
import binascii
import collections
import json
import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from oz0_common import certs, purge_format
from oz0_common.files import write_private
from oz0_node.errors import AgentError
from oz0_node.identity import IdentityDir
from oz0_node.messages import Message

log = logging.getLogger(__name__)

NONCES_FILE = "purge-nonces"
MAX_NONCES = 1000


@dataclass(frozen=True)
class PurgeCommand:
    """A verified purge command."""

    cluster: str
    node_id: str
    nonce: str
    challenge: str
    issued_at: str | None


@dataclass(frozen=True)
class Purged:
    """How `oz0-node start` ends when its node was purged: what was deleted."""

    node_id: str
    data_dir: Path
    launcher: Path | None

    def summary(self) -> str:
        deleted = f"{self.data_dir}" + (f" and {self.launcher}" if self.launcher else "")
        return f"node {self.node_id} purged: deleted {deleted}"


class CommandRefused(Exception):
    """The command does not pass; REASON is the one line the edge gets back."""

    def __init__(self, reason: str, nonce: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.nonce = nonce


class PurgeConfirmed(Exception):
    """The node answered `purged`: the agent stops and deletes its files.

    Neither an `EdgeUnavailable` (nothing reconnects) nor an `AgentError` (it is not a
    failure): `agent.run` catches it and carries the purge out.
    """

    def __init__(self, command: PurgeCommand) -> None:
        super().__init__(f"node {command.node_id} purged by its cluster")
        self.command = command


class PurgeMemory:
    """What the agent keeps across purge commands: the nonces of every signed one it got
    (the newest MAX_NONCES), and why its data directory must not be deleted, once found.

    That finding sticks for the life of the process: the agent writes its own node.json
    from memory (a new state, new edges), which would restore an identity someone changed
    under it, and the next command would then pass and delete the directory.
    """

    def __init__(self, path: Path, nonces: list[str]) -> None:
        self.path = path
        self._nonces: collections.deque[str] = collections.deque(nonces, maxlen=MAX_NONCES)
        self.unsafe_to_delete: str | None = None

    def deletion_refusal(self, data_dir: Path, node_id: str) -> str | None:
        if self.unsafe_to_delete is None:
            self.unsafe_to_delete = deletion_refusal(data_dir, node_id)
        return self.unsafe_to_delete

    @classmethod
    def load(cls, data_dir: Path) -> PurgeMemory:
        path = data_dir / NONCES_FILE
        try:
            lines = path.read_text(encoding="ascii").split()
        except FileNotFoundError:
            lines = []
        except (OSError, ValueError) as e:
            log.warning("cannot read %s (%s); starting with no seen purge nonces", path, e)
            lines = []
        return cls(path, [n.lower() for n in lines if purge_format.NONCE.fullmatch(n)])

    def __contains__(self, nonce: str) -> bool:
        return nonce.lower() in self._nonces

    def add(self, nonce: str) -> None:
        """Remember NONCE, on disk too; a failed write is logged, memory still has it."""
        nonce = nonce.lower()
        if nonce in self._nonces:
            return
        self._nonces.append(nonce)
        try:
            write_private(self.path, "".join(f"{n}\n" for n in self._nonces).encode())
        except OSError as e:
            log.warning("cannot write %s: %s", self.path, e.strerror or e)


def verify(
    message: Message,
    *,
    identity: IdentityDir,
    cluster: str,
    node_id: str,
    challenge: str | None,
    nonces: PurgeMemory,
) -> PurgeCommand:
    """The command in MESSAGE if it passes every check (module docstring); CommandRefused."""
    command_text, signature_text = message.get("command"), message.get("signature")
    if not isinstance(command_text, str) or not isinstance(signature_text, str):
        raise CommandRefused("malformed command: no command and signature", None)
    try:
        command_bytes = base64.b64decode(command_text, validate=True)
        signature = base64.b64decode(signature_text, validate=True)
    except (binascii.Error, ValueError):
        raise CommandRefused(
            "malformed command: command or signature is not base64", None
        ) from None
    fields = _json_object(command_bytes)
    # Only to tell the edge which command this answers; nothing here is trusted yet.
    raw_nonce = fields.get("nonce") if fields is not None else None
    nonce = None
    if isinstance(raw_nonce, str) and purge_format.NONCE.fullmatch(raw_nonce):
        nonce = raw_nonce.lower()

    try:
        ca_pem = identity.load_ca_pem()
    except AgentError as e:
        raise CommandRefused(f"no cluster CA to verify with: {e}", nonce) from None
    if not _signed_by(certs.cert_from_pem(ca_pem), command_bytes, signature):
        raise CommandRefused("signature does not verify with the cluster CA", nonce)

    if fields is None:
        raise CommandRefused("malformed command: not a JSON object", nonce)
    action = fields.get("action")
    if action != purge_format.ACTION:
        raise CommandRefused(
            f"malformed command: action is {action!r}, not {purge_format.ACTION!r}", nonce
        )
    if nonce is None:
        raise CommandRefused("malformed command: nonce is not 32 hex digits", nonce)
    texts = {}
    for key in purge_format.NAMED:
        value = fields.get(key)
        if not isinstance(value, str):
            raise CommandRefused(f"malformed command: no {key}", nonce)
        texts[key] = value
    issued_at = fields.get("issued_at")

    seen_before = nonce in nonces
    nonces.add(nonce)
    if texts["cluster"] != cluster:
        raise CommandRefused(
            f"command names cluster {texts['cluster']}, this node belongs to {cluster}", nonce
        )
    if texts["node_id"] != node_id:
        raise CommandRefused(
            f"command names node {texts['node_id']}, this is node {node_id}", nonce
        )
    if challenge is None or texts["challenge"].lower() != challenge.lower():
        raise CommandRefused("command was signed for another connection", nonce)
    if seen_before:
        raise CommandRefused("nonce already seen", nonce)
    refusal = nonces.deletion_refusal(identity.data_dir, node_id)
    if refusal is not None:
        raise CommandRefused(refusal, nonce)
    return PurgeCommand(
        cluster=texts["cluster"],
        node_id=texts["node_id"],
        nonce=nonce,
        challenge=texts["challenge"],
        issued_at=issued_at if isinstance(issued_at, str) else None,
    )


def _json_object(data: bytes) -> dict[str, object] | None:
    try:
        fields = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return fields if isinstance(fields, dict) else None


def _signed_by(ca: x509.Certificate, data: bytes, signature: bytes) -> bool:
    """Whether SIGNATURE (DER ECDSA with SHA-256) over DATA verifies with CA's key."""
    key = ca.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return False
    try:
        key.verify(signature, data, purge_format.signature_algorithm())
    except InvalidSignature:
        return False
    return True


# --- after `purged` ---------------------------------------------------------------------


def deletion_refusal(data_dir: Path, node_id: str) -> str | None:
    """Why DATA_DIR must not be deleted for a purge of NODE_ID, or None if it may be."""
    if not shutil.rmtree.avoids_symlink_attacks:
        return (
            f"this platform cannot delete {data_dir} without risk of following "
            f"symbolic links out of it"
        )
    if data_dir.is_symlink():
        return f"{data_dir} is a symbolic link; a purge does not delete through one"
    if not data_dir.is_dir():
        return f"{data_dir} is not a directory"
    try:
        record = IdentityDir(data_dir).load_record()
    except AgentError as e:
        return str(e)
    if record is None or record.node_id is None:
        return f"{data_dir} holds no node identity"
    if record.node_id != node_id:
        return f"{data_dir} holds the identity of node {record.node_id}, not of node {node_id}"
    return None


def delete_data_dir(data_dir: Path, node_id: str) -> None:
    """Delete DATA_DIR, which must hold NODE_ID's identity; symbolic links are not followed."""
    refusal = deletion_refusal(data_dir, node_id)
    if refusal is not None:
        raise AgentError(f"node {node_id} was purged, but nothing was deleted: {refusal}")
    try:
        shutil.rmtree(data_dir)
    except OSError as e:
        raise AgentError(
            f"node {node_id} was purged, but deleting {data_dir} failed: {e.strerror or e} "
            f"({e.filename or data_dir})"
        ) from None


def remove_empty(directories: list[Path]) -> None:
    """Remove each of DIRECTORIES (deepest first) the agent made above its data directory,
    if it is empty now; never a link, never one with anything in it."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError as e:
            log.info("left %s: %s", directory, e.strerror or e)
            return
        log.info("removed %s, which the agent had made", directory)


def delete_launcher(launcher: Path | None) -> Path | None:
    """Delete LAUNCHER if it is a regular file or a symbolic link; the path deleted, or None."""
    if launcher is None:
        return None
    try:
        mode = os.lstat(launcher).st_mode
    except FileNotFoundError:
        log.info("launcher %s does not exist; nothing to delete", launcher)
        return None
    except OSError as e:
        log.warning("cannot delete launcher %s: %s", launcher, e.strerror or e)
        return None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        log.warning("launcher %s is not a file or a symbolic link; not deleted", launcher)
        return None
    try:
        launcher.unlink()
    except OSError as e:
        log.warning("cannot delete launcher %s: %s", launcher, e.strerror or e)
        return None
    log.info("deleted launcher %s", launcher)
    return launcher
