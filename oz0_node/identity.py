"""The node's identity on disk: `DIR/identity/` (0700).

    node.key   P-256 private key, 0600, created once and never overwritten
    node.crt   the node's certificate from the cluster CA (only once accepted)
    ca.crt     the pinned cluster CA certificate
    node.json  cluster, CA hash, node ID, tenant, known edges, state as last known, the
               launcher a purge deletes (when `--launcher` named one), and how many
               attempts the node runs at once (when `--max-jobs` said)
    node.key.next, node.crt.next
               a renewal under way (renewal.py): the next key (0600), made before it is
               sent; then its certificate; both replace node.key and node.crt at once

Every file is replaced atomically (`write_private`), so a crash leaves the old version or
the new one, never half of either. The key is written before anything that needs it.
A renewal installs its pair in a fixed order (key, then certificate, each a rename), and
`finish_renewal` completes one a crash interrupted, so key and certificate always match.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from oz0_common import certs
from oz0_common.datadir import CREATED_PARENTS_FILE, make_data_dir
from oz0_common.files import write_private
from oz0_node.errors import AgentError

log = logging.getLogger(__name__)

IDENTITY_DIR = "identity"
KEY_FILE = "node.key"
CERT_FILE = "node.crt"
NEXT_KEY_FILE = "node.key.next"
NEXT_CERT_FILE = "node.crt.next"
CA_FILE = "ca.crt"
RECORD_FILE = "node.json"
LOCK_FILE = "agent.lock"
# What a flat layout (identity files directly in DIR) holds.
IDENTITY_FILES = (KEY_FILE, CERT_FILE, NEXT_KEY_FILE, NEXT_CERT_FILE, CA_FILE, RECORD_FILE)

# `start --max-jobs`: how many attempts the node runs at once (jobs/manager.py), unless
# node.json remembers another; the cluster holds the same bounds (its nodes table).
DEFAULT_MAX_JOBS = 4
MAX_JOBS = 256

# The node has pinned the CA but has no answer to its join yet.
STATE_JOINING = "joining"


@dataclass
class NodeRecord:
    """What node.json remembers."""

    cluster: str
    ca_hash: str
    node_id: str | None = None
    tenant: str | None = None
    state: str = STATE_JOINING
    edges: list[str] = field(default_factory=list)
    launcher: str | None = None
    max_jobs: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> NodeRecord:
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        cluster, ca_hash = raw["cluster"], raw["ca_hash"]
        node_id, tenant, state = raw.get("node_id"), raw.get("tenant"), raw.get("state")
        edges, launcher = raw.get("edges", []), raw.get("launcher")
        if not isinstance(cluster, str) or not isinstance(ca_hash, str):
            raise ValueError("cluster and ca_hash must be strings")
        if not isinstance(state, str):
            raise ValueError("state must be a string")
        if not (node_id is None or isinstance(node_id, str)):
            raise ValueError("node_id must be a string or null")
        if not (tenant is None or isinstance(tenant, str)):
            raise ValueError("tenant must be a string or null")
        if not isinstance(edges, list) or not all(isinstance(e, str) for e in edges):
            raise ValueError("edges must be a list of strings")
        if not (launcher is None or isinstance(launcher, str)):
            raise ValueError("launcher must be a string or null")
        max_jobs = raw.get("max_jobs")
        if not (max_jobs is None or valid_max_jobs(max_jobs)):
            raise ValueError(f"max_jobs must be a whole number from 1 to {MAX_JOBS} or null")
        return cls(cluster, ca_hash, node_id, tenant, state, list(edges), launcher, max_jobs)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def valid_max_jobs(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_JOBS


class IdentityDir:
    """The files of DATA_DIR/identity; nothing here talks to the network."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.root = data_dir / IDENTITY_DIR

    @property
    def key_path(self) -> Path:
        return self.root / KEY_FILE

    @property
    def cert_path(self) -> Path:
        return self.root / CERT_FILE

    @property
    def ca_path(self) -> Path:
        return self.root / CA_FILE

    @property
    def record_path(self) -> Path:
        return self.root / RECORD_FILE

    def ensure_data_dir(self) -> None:
        """Make DIR (0700) unless it exists, listing the directories made above it
        (oz0_common.datadir.make_data_dir)."""
        try:
            make_data_dir(self.data_dir)
        except OSError as e:
            raise AgentError(f"cannot create {self.data_dir}: {e.strerror or e}") from None

    def created_parents(self) -> list[Path]:
        """The directories above DIR that the agent made, deepest first; only DIR's own
        ancestors count, whatever the file says."""
        try:
            raw = json.loads((self.data_dir / CREATED_PARENTS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        ancestors = set(self.data_dir.parents)
        if not isinstance(raw, list):
            return []
        return [Path(p) for p in raw if isinstance(p, str) and Path(p) in ancestors]

    def has_flat_layout(self) -> bool:
        return (self.data_dir / RECORD_FILE).is_file() and not self.record_path.exists()

    def migrate_flat_layout(self) -> None:
        """Move identity files kept directly in DIR (a flat layout) into DIR/identity/.

        Refuses, changing nothing, when DIR/identity/ holds a node record already."""
        flat = [self.data_dir / name for name in IDENTITY_FILES]
        present = [p for p in flat if p.is_file() and not p.is_symlink()]
        if not any(p.name == RECORD_FILE for p in present):
            return
        if os.path.lexists(self.record_path):
            raise AgentError(
                f"{self.data_dir} holds a node identity both in it and in {self.root}; keep "
                f"one: move {', '.join(p.name for p in present)} out of {self.data_dir}"
            )
        try:
            with self.locked():
                self.create()
                # The record last: until it moves, the next start finds the flat layout again.
                for path in sorted(present, key=lambda p: p.name == RECORD_FILE):
                    path.replace(self.root / path.name)
        except OSError as e:
            raise AgentError(
                f"cannot move the identity in {self.data_dir} into {self.root}: "
                f"{e.strerror or e}; move {', '.join(IDENTITY_FILES)} there by hand"
            ) from None
        log.info("moved the node identity in %s into %s", self.data_dir, self.root)

    def create(self) -> None:
        """Make DIR (0700 when new) and DIR/identity (always 0700)."""
        self.ensure_data_dir()
        try:
            self.root.mkdir(mode=0o700, exist_ok=True)
            self.root.chmod(0o700)
        except OSError as e:
            raise AgentError(f"cannot create {self.root}: {e.strerror or e}") from None

    # --- node.json ----------------------------------------------------------------------

    def load_record(self) -> NodeRecord | None:
        """node.json, or None when this directory holds no identity yet."""
        try:
            text = self.record_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise AgentError(f"cannot read {self.record_path}: {e.strerror or e}") from None
        try:
            return NodeRecord.from_json(json.loads(text))
        except (ValueError, KeyError) as e:
            raise AgentError(f"{self.record_path} is malformed: {e}") from None

    def save_record(self, record: NodeRecord) -> None:
        data = json.dumps(record.to_json(), indent=2) + "\n"
        self._write(self.record_path, data.encode())

    # --- key ----------------------------------------------------------------------------

    def load_or_create_key(self) -> ec.EllipticCurvePrivateKey:
        """The node key: made here once (0600 from its first byte), then only ever read."""
        return self._load_or_create(self.key_path)

    def _load_or_create(self, path: Path) -> ec.EllipticCurvePrivateKey:
        key = certs.new_private_key()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self._read_key(path)
        except OSError as e:
            raise AgentError(f"cannot create {path}: {e.strerror or e}") from None
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, certs.key_to_pem(key))
            os.fsync(fd)
        finally:
            os.close(fd)
        log.info("created node key %s", path)
        return key

    def _read_key(self, path: Path) -> ec.EllipticCurvePrivateKey:
        pem = certs.read_private(path, "node key", AgentError)
        try:
            return certs.key_from_pem(pem)
        except ValueError as e:
            raise AgentError(f"{path} is not a node key: {e}") from None

    # --- renewal ------------------------------------------------------------------------

    @property
    def next_key_path(self) -> Path:
        return self.root / NEXT_KEY_FILE

    @property
    def next_cert_path(self) -> Path:
        return self.root / NEXT_CERT_FILE

    def next_key(self) -> ec.EllipticCurvePrivateKey:
        """The key the next certificate is for: made once per renewal, kept until installed,
        so a renewal whose answer was lost can still be completed with it."""
        return self._load_or_create(self.next_key_path)

    def has_next_key(self) -> bool:
        return self.next_key_path.is_file()

    def load_next_key(self) -> ec.EllipticCurvePrivateKey:
        return self._read_key(self.next_key_path)

    def install_renewal(self, cert: x509.Certificate) -> None:
        """Make CERT (for next_key) and next_key the node's certificate and key."""
        self._write(self.next_cert_path, certs.cert_to_pem(cert))
        self.finish_renewal()

    def finish_renewal(self) -> None:
        """Complete an installation a crash interrupted; without node.crt.next, nothing to do.

        node.crt.next is written only once node.key.next holds its key, and removed last:
        if it exists, the key is node.key.next or (already moved) node.key.
        """
        if not self.next_cert_path.is_file():
            return
        try:
            if self.next_key_path.is_file():
                self.next_key_path.replace(self.key_path)
            self.next_cert_path.replace(self.cert_path)
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise AgentError(f"cannot install the renewed certificate: {e.strerror or e}") from None
        log.info("installed the renewed node certificate and key in %s", self.root)

    def load_certificate(self) -> x509.Certificate:
        try:
            return certs.cert_from_pem(self.cert_path.read_bytes())
        except (OSError, ValueError) as e:
            raise AgentError(f"cannot use {self.cert_path}: {e}") from None

    # --- certificates -------------------------------------------------------------------

    def save_ca(self, ca_pem: bytes) -> None:
        self._write(self.ca_path, ca_pem)

    def load_ca_pem(self) -> bytes:
        try:
            pem = self.ca_path.read_bytes()
            certs.cert_from_pem(pem)
        except FileNotFoundError:
            raise AgentError(
                f"{self.ca_path} is missing: the identity in {self.data_dir} is incomplete"
            ) from None
        except (OSError, ValueError) as e:
            raise AgentError(f"cannot use {self.ca_path}: {e}") from None
        return pem

    def has_certificate(self) -> bool:
        return self.cert_path.is_file()

    def save_certificate(self, cert: x509.Certificate) -> None:
        self._write(self.cert_path, certs.cert_to_pem(cert))

    def _write(self, path: Path, data: bytes) -> None:
        try:
            write_private(path, data)
        except OSError as e:
            raise AgentError(f"cannot write {path}: {e.strerror or e}") from None

    # --- one agent per directory --------------------------------------------------------

    def lock_held(self) -> bool | None:
        """Whether an agent holds DIR/agent.lock now; None when that cannot be told."""
        try:
            fd = os.open(self.data_dir / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None
        finally:
            os.close(fd)
        return False

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold DIR/agent.lock: two agents on one identity would fight over its stream."""
        path = self.data_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise AgentError(f"cannot open {path}: {e.strerror or e}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AgentError(
                    f"another oz0-node agent is already running with --data-dir {self.data_dir}"
                ) from None
            yield
        finally:
            os.close(fd)
