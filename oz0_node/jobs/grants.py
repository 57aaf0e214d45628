"""The node's check of an attempt's grant, before it makes any directory or process
(docs/node-protocol.md, "Signed attempts"; the format is oz0_common/attempt_grant.py).

An attempt runs only if all of these hold, checked in this order, the first that fails
being the reason it is refused: it carries a grant whose signature verifies with the
cluster CA certificate this node pinned at its join (never one an edge offers); the
signed payload is of this format; it names this node's cluster, tenant and node; it has
not expired (`not_after`, with CLOCK_SKEW allowed for this node's clock); its job ID,
attempt number, command, environment digest, limits and timeout are those of the input
it came with (and the user, for a session that names one); and this node has not run
that (job, attempt) before.

What this node ran is kept in DATA_DIR/attempts-run (0600, replaced whole): each (job,
attempt) with its grant's `not_after`, forgotten once that has passed (with the skew), as
the grant can no longer be run anywhere by then. Refusing is the safe side of every doubt:
a record that cannot be written refuses the attempt, and one that cannot be read or is not
this format refuses every attempt until a person repairs it (`RunRecord.unusable` says
how: in the agent's log and `oz0-node status`); it is read again at each attempt, so the
repair needs no restart.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from oz0_common import attempt_grant
from oz0_common.files import write_private

log = logging.getLogger(__name__)

RECORD_FILE = "attempts-run"
# How long the grants a removed record held may still be good for (docs/node-protocol.md,
# "Signed attempts": 15 s to start plus 30 s; an --all job's part, its queue timeout).
GRANT_LIFE = "45 s, an --all job's part its queue timeout"
# How far this node's clock may be behind the placing server's and a grant still refused
# once expired (or ahead, and one still taken until then).
CLOCK_SKEW = 30.0


class AttemptRefused(Exception):
    """The attempt does not pass; REASON is the one line the cluster gets."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GrantExpired(AttemptRefused):
    """The grant's not_after has passed: the attempt waited too long to reach this node
    (the cluster moves it rather than fail the job: another node gets a fresh grant)."""


class RecordUnwritable(AttemptRefused):
    """The node cannot record the attempt as run (its disk full, say): its own trouble,
    not the grant's. Not run, and not refused: the cluster moves it to another node, as
    an attempt whose directory cannot be made (a refusal would fail the job, which another
    node could run)."""


class RunRecord:
    """The (job, attempt)s this node has run, each until its grant's not_after."""

    def __init__(self, path: Path, entries: dict[str, float], unusable: str | None = None) -> None:
        self.path = path
        self._entries = entries
        # Why no attempt may run (the record cannot be read), and how to repair it.
        self.unusable = unusable
        # Called (in whichever thread checks an attempt) when `unusable` changes.
        self.on_change: Callable[[], None] | None = None

    @classmethod
    def load(cls, data_dir: Path) -> RunRecord:
        """DATA_DIR's record; an unreadable one comes back `unusable` (logged once)."""
        path = data_dir / RECORD_FILE
        entries, why = _read(path)
        record = cls(path, entries, _repair(path, why) if why is not None else None)
        if record.unusable is not None:
            log.error("%s", record.unusable)
        return record

    def usable(self) -> bool:
        """Whether attempts may run: a record found unreadable is read again (a person may
        have repaired it since)."""
        if self.unusable is None:
            return True
        entries, why = _read(self.path)
        if why is not None:
            return False
        log.warning("%s is readable again: attempts run here again", self.path)
        self._entries, self.unusable = entries, None
        if self.on_change is not None:
            self.on_change()
        return True

    @staticmethod
    def key(job_id: str, attempt: int) -> str:
        return f"{job_id}/{attempt}"

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def add(self, key: str, not_after: float, now: float) -> None:
        """Record KEY (pruning what expired) on disk: OSError if it cannot be written."""
        assert self.unusable is None, "an unreadable record is never written over"
        kept = {k: v for k, v in self._entries.items() if v + CLOCK_SKEW >= now}
        kept[key] = not_after
        write_private(self.path, json.dumps(kept, sort_keys=True).encode())
        self._entries = kept


def _read(path: Path) -> tuple[dict[str, float], str | None]:
    """PATH's entries, or why they cannot be had (no file: none, and nothing wrong)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except OSError as e:
        return {}, str(e.strerror or e)
    except ValueError as e:  # UnicodeDecodeError too
        return {}, f"not JSON ({e})"
    if not isinstance(raw, dict):
        return {}, "not a JSON object"
    entries = {}
    for key, value in raw.items():
        # Each entry's, or none: a record read in part could let an attempt run twice.
        if not isinstance(value, int | float) or isinstance(value, bool):
            return {}, f"the entry {key[:80]!r} has no not_after"
        entries[key] = float(value)
    return entries, None


def _repair(path: Path, why: str) -> str:
    """The one line that says the record is unreadable, what follows, and the repair."""
    return (
        f"cannot read {path}, this node's record of the attempts it ran ({why}): no attempt "
        f"runs here until it is repaired; fix its JSON or remove it (removed, an attempt it "
        f"recorded could run here again while its grant holds: {GRANT_LIFE})"
    )


class GrantCheck:
    """Checks the grants of one runtime's attempts (module docstring)."""

    def __init__(
        self,
        *,
        cluster: str,
        tenant: str,
        node_id: str,
        ca: x509.Certificate,
        record: RunRecord,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster, self.tenant, self.node_id = cluster, tenant, node_id
        self.ca, self.record, self.clock = ca, record, clock

    def check(self, raw: Mapping[str, Any]) -> None:
        """Pass, and the attempt counts as run here from now on; or AttemptRefused."""
        try:
            data, signature = attempt_grant.decode(raw.get("grant"))
        except attempt_grant.MalformedGrant as e:
            raise AttemptRefused(str(e)) from None
        key = self.ca.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise AttemptRefused("the pinned cluster CA has no EC key to verify with")
        try:
            key.verify(signature, data, attempt_grant.signature_algorithm())
        except InvalidSignature:
            raise AttemptRefused(
                "the grant's signature does not verify with the cluster CA"
            ) from None
        try:
            fields = attempt_grant.fields_of(data)
        except attempt_grant.MalformedGrant as e:
            raise AttemptRefused(str(e)) from None
        for name, mine in (
            ("cluster", self.cluster),
            ("tenant", self.tenant),
            ("node_id", self.node_id),
        ):
            if fields.get(name) != mine:
                raise AttemptRefused(f"the grant names {name} {fields.get(name)!r}, not {mine!r}")
        not_after, now = fields.get("not_after"), self.clock()
        if not isinstance(not_after, int | float) or isinstance(not_after, bool):
            raise AttemptRefused("the grant has no not_after")
        if now > not_after + CLOCK_SKEW:
            raise GrantExpired(f"the grant expired {now - not_after:.0f} s ago")
        secrets = raw.get("secrets")
        env = raw.get("env") or {}
        given = {
            "job_id": raw.get("job_id"),
            "attempt": raw.get("attempt"),
            "command": raw.get("command"),
            "env_digest": attempt_grant.env_digest(env, secrets)
            if isinstance(env, dict) and (secrets is None or isinstance(secrets, str))
            else None,
            "limits": raw.get("limits"),
            "timeout": raw.get("timeout"),
            "files": raw.get("files"),
            "user": raw.get("user"),
        }
        for name in attempt_grant.MATCHED:
            if fields.get(name) != given[name]:
                what = "environment" if name == "env_digest" else name
                raise AttemptRefused(f"the attempt's {what} is not the one the grant signed")
        job_id, attempt = fields["job_id"], fields["attempt"]
        if not isinstance(job_id, str) or not isinstance(attempt, int):
            raise AttemptRefused("the grant names no job and attempt")
        run = RunRecord.key(job_id, attempt)
        if not self.record.usable():
            assert self.record.unusable is not None
            raise AttemptRefused(self.record.unusable)
        if run in self.record:
            raise AttemptRefused(f"this node has run job {job_id} attempt {attempt} already")
        try:
            self.record.add(run, float(not_after), now)
        except OSError as e:
            raise RecordUnwritable(
                f"cannot record the attempt as run in {self.record.path}: {e.strerror or e}"
            ) from None
