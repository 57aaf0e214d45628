"""A file push's part, run by the agent itself (docs/files.md; the order's format is
oz0_common/file_push.py).

Why not a process like any other attempt: an attempt runs as a UID of its own that owns
nothing on the machine, while a push writes where the node allows (as root, when asked,
with the owner asked); and the content comes over the agent's own control stream, which
no attempt's process may touch. So the intake (intake.py) checks the part's grant as any
attempt's, then hands a push here instead of to a supervisor:

1. The destination is checked against what this node allows (PushPolicy: the directories
   pushes may write, `oz0-node start --push-dir`, by default none but DATA_DIR/files, where
   a relative destination goes; a root-owned file only with `--push-root-owned`). Its
   directory is resolved and held open, so a symbolic link cannot move the write elsewhere.
2. A file there already with the same content (its SHA-256), mode and owner: `unchanged`,
   nothing fetched.
3. Else the blob is fetched from the edge (`file_get`/`file_data`, a few pieces asked at
   once, written in order) into a temporary file in the destination's directory (0600
   until it is complete), hashed as it comes; a SHA-256 other than the one the grant
   signed refuses it, and the temporary file goes. Then its mode and owner, fsync,
   rename over the destination, fsync of the directory: `written`.

The outcome is the part's output (one line: `written`, `unchanged` or `error: WHY`) and
its exit code (0, 0, 1), reported as any attempt's (`job_output`, `attempt_done`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trio

from oz0_common.attempt_messages import DONE, AttemptDone, AttemptResult
from oz0_common.file_push import DATA, GET, PIECE, WINDOW, BadPush, PushOrder, check_name
from oz0_node.errors import one_error
from oz0_node.jobs.edge_link import DONE_ACK, OUTPUT_ACK, EdgeLink, LinkDown
from oz0_node.messages import Message

log = logging.getLogger(__name__)

FILES_DIR = "files"
# One piece's wait for its edge; a piece not had in FETCH_WITHIN, retried, ends the push.
PIECE_TIMEOUT = 15.0
FETCH_WITHIN = 120.0
REPORT_WITHIN = 600.0
RETRY_AFTER = 1.0
WRITTEN, UNCHANGED = "written", "unchanged"


class PushRefused(Exception):
    """The push does not pass here; the message is the one line the cluster gets."""


@dataclass(frozen=True)
class PushPolicy:
    """What this node lets pushes write: DIRS (beside DATA_DIR/files, always), and whether
    a file may be root's."""

    files_dir: Path
    dirs: tuple[Path, ...] = ()
    root_owned: bool = False

    @classmethod
    def of(
        cls, data_dir: Path, dirs: tuple[Path, ...] = (), root_owned: bool = False
    ) -> PushPolicy:
        return cls(data_dir / FILES_DIR, tuple(dirs), root_owned)


@dataclass(frozen=True)
class Target:
    """Where the push writes: DIR_FD (held open) and the file's NAME in it, as whom."""

    path: Path
    dir_fd: int
    name: str
    uid: int
    gid: int


def _owner(owner: str | None) -> tuple[int, int]:
    if owner is None:
        return os.geteuid(), os.getegid()
    try:
        entry = pwd.getpwuid(int(owner)) if owner.isdigit() else pwd.getpwnam(owner)
    except (KeyError, ValueError):
        if owner.isdigit():
            return int(owner), int(owner)
        raise PushRefused(f"no user {owner} on this node") from None
    return entry.pw_uid, entry.pw_gid


def _within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def open_target(policy: PushPolicy, order: PushOrder) -> Target:
    """ORDER's destination, if this node allows it (PushRefused if not), its directory
    held open."""
    if not order.dest.startswith("/"):
        policy.files_dir.mkdir(mode=0o700, exist_ok=True)
        dest = policy.files_dir / order.dest
    else:
        dest = Path(order.dest)
    uid, gid = _owner(order.owner)
    own = Path(os.path.realpath(policy.files_dir))
    roots = [own, *(Path(os.path.realpath(d)) for d in policy.dirs)]
    parent = Path(os.path.realpath(dest.parent))
    if not _within(parent, roots):
        allowed = ", ".join(str(r) for r in roots)
        raise PushRefused(f"this node lets pushes write only in {allowed}, not {dest}")
    if uid == 0 and not policy.root_owned and not _within(parent, [own]):
        raise PushRefused(
            f"{dest} would be root's: this node does not allow root-owned pushes"
            " (oz0-node start --push-root-owned)"
        )
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise PushRefused(f"cannot open {parent}: {e.strerror or e}") from None
    # What was opened, not what the path named a moment before: a directory swapped for a
    # link meanwhile is caught here, and the write goes through this descriptor only.
    opened = Path(f"/proc/self/fd/{dir_fd}").readlink()
    if not _within(opened, roots):
        os.close(dir_fd)
        raise PushRefused(f"{parent} moved to {opened}, outside what this node allows")
    return Target(opened / dest.name, dir_fd, dest.name, uid, gid)


def _same(target: Target, order: PushOrder) -> bool:
    """Whether the destination holds ORDER's content already, with its mode and owner."""
    try:
        fd = os.open(target.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target.dir_fd)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_size != order.size
            or stat.S_IMODE(st.st_mode) != order.mode
            or (st.st_uid, st.st_gid) != (target.uid, target.gid)
        ):
            return False
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == order.sha256


class Staging:
    """The temporary file in the destination's directory, removed unless renamed."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.name = f".{target.name}.oz0-{os.urandom(6).hex()}"
        self.fd = os.open(
            self.name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=target.dir_fd,
        )
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        self.size += len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def finish(self, order: PushOrder) -> None:
        got = self.digest.hexdigest()
        if self.size != order.size or got != order.sha256:
            raise PushRefused(
                f"the content received ({self.size} bytes) has SHA-256 {got}, not the"
                f" {order.sha256} its grant signed: refused, nothing written"
            )
        t = self.target
        os.fchown(self.fd, t.uid, t.gid)
        os.fchmod(self.fd, order.mode)  # after chown, which clears set-id bits
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        os.rename(self.name, t.name, src_dir_fd=t.dir_fd, dst_dir_fd=t.dir_fd)
        self.name = ""
        os.fsync(t.dir_fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        if self.name:
            with contextlib.suppress(OSError):
                os.unlink(self.name, dir_fd=self.target.dir_fd)


@contextlib.contextmanager
def _held(target: Target) -> Iterator[Target]:
    try:
        yield target
    finally:
        os.close(target.dir_fd)


async def run(link: EdgeLink, policy: PushPolicy, job: str, attempt: int, order: PushOrder) -> None:
    """Run the push and report its outcome, as attempt ATTEMPT of JOB."""
    try:
        outcome = await _push(link, policy, job, attempt, order)
        text, code = outcome, 0
        log.info("job %s attempt %d: %s %s", job, attempt, outcome, order.dest)
    except PushRefused as e:
        text, code = f"error: {e}", 1
        log.warning("job %s attempt %d: push to %s refused: %s", job, attempt, order.dest, e)
    except OSError as e:
        text, code = f"error: {order.dest}: {e.strerror or e}", 1
        log.warning("job %s attempt %d: push to %s failed: %s", job, attempt, order.dest, e)
    await _report(link, job, attempt, text + "\n", code)


async def _push(
    link: EdgeLink, policy: PushPolicy, job: str, attempt: int, order: PushOrder
) -> str:
    target = await trio.to_thread.run_sync(open_target, policy, order)
    with _held(target):
        if await trio.to_thread.run_sync(_same, target, order):
            return UNCHANGED
        await _fetch(link, job, attempt, order, target)
    return WRITTEN


@dataclass(eq=False)
class _Asked:
    """A piece asked of the edge: WANT bytes from OFFSET; DATA (or ERROR) once DONE."""

    offset: int
    want: int
    done: trio.Event = field(default_factory=trio.Event)
    data: bytes = b""
    error: Exception | None = None


async def _fetch(link: EdgeLink, job: str, attempt: int, order: PushOrder, target: Target) -> None:
    """ORDER's content fetched, checked and renamed to TARGET (`Staging`).

    Up to WINDOW pieces of PIECE bytes are asked at once (a round trip each would pace
    the push); they are written in order as they come, so at most WINDOW pieces wait here.
    A piece the edge sent shorter than asked (an older edge serves a row at a time) has
    its rest asked next."""
    staging = await trio.to_thread.run_sync(Staging, target)
    try:
        try:
            async with trio.open_nursery() as nursery:
                asked: dict[int, _Asked] = {}

                def ask(offset: int, want: int) -> None:
                    piece = asked[offset] = _Asked(offset, want)
                    nursery.start_soon(_get, link, job, attempt, order, piece)

                ahead = 0  # the first byte not asked for yet
                while staging.size < order.size:
                    while ahead < order.size and len(asked) < WINDOW:
                        want = min(PIECE, order.size - ahead)
                        ask(ahead, want)
                        ahead += want
                    piece = asked.pop(staging.size)
                    await piece.done.wait()
                    if piece.error is not None:
                        raise piece.error
                    await trio.to_thread.run_sync(staging.write, piece.data)
                    if len(piece.data) < piece.want:
                        ask(staging.size, piece.want - len(piece.data))
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise one_error(group) from None
        await trio.to_thread.run_sync(staging.finish, order)
    finally:
        await trio.to_thread.run_sync(staging.close)


async def _get(link: EdgeLink, job: str, attempt: int, order: PushOrder, piece: _Asked) -> None:
    try:
        data = await _piece(link, job, attempt, order, piece.offset, piece.want)
        piece.data = data[: piece.want]
    except PushRefused as e:
        piece.error = e
    finally:
        piece.done.set()


# --- `job run --file`: files for an attempt's working directory ---------------------------

STAGING_DIR = "staging"


def staged_dir(data_dir: Path, job: str, attempt: int) -> Path:
    """Where an attempt's files wait, checked, for its supervisor to place them."""
    return data_dir / STAGING_DIR / f"{job}-{attempt}"


def parse_files(raw: object) -> list[PushOrder]:
    """An attempt's `files` (its grant signed them): each as an order to its name; BadPush."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadPush("files is a list")
    orders = []
    for entry in raw:
        if not isinstance(entry, dict):
            raise BadPush("each of files is {sha256, size, name}")
        name = check_name(entry.get("name"))
        orders.append(PushOrder(entry.get("sha256"), entry.get("size"), name, 0o600))  # type: ignore[arg-type]
    return orders


async def stage_files(
    link: EdgeLink, data_dir: Path, job: str, attempt: int, orders: list[PushOrder]
) -> list[tuple[str, str]]:
    """ORDERS fetched from the edge and checked (each against the SHA-256 its grant signed)
    into the attempt's staging directory: (name, path) of each; PushRefused, OSError."""
    directory = staged_dir(data_dir, job, attempt)
    await trio.to_thread.run_sync(_fresh_dir, directory)
    staged = []
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for order in orders:
            target = Target(directory / order.dest, dir_fd, order.dest, os.geteuid(), os.getegid())
            await _fetch(link, job, attempt, order, target)
            staged.append((order.dest, str(target.path)))
    finally:
        os.close(dir_fd)
    return staged


def _fresh_dir(directory: Path) -> None:
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    remove_staged(directory)
    directory.mkdir(mode=0o700)


def remove_staged(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


async def _piece(
    link: EdgeLink, job: str, attempt: int, order: PushOrder, offset: int, most: int
) -> bytes:
    """Up to MOST of the blob's bytes from OFFSET, from whichever edge the node has
    (asked again while it is `unavailable`)."""
    fields: Message = {
        "job": job, "attempt": attempt, "sha256": order.sha256, "offset": offset, "most": most,
    }  # fmt: skip
    key = (DATA, job, attempt, offset)
    with trio.move_on_after(FETCH_WITHIN):
        while True:
            try:
                answer = await link.exchange(GET, fields, key, PIECE_TIMEOUT)
            except LinkDown:
                answer = None
            if answer is not None:
                error = answer.get("error")
                if isinstance(error, str):
                    if error != "unavailable":
                        raise PushRefused(f"the edge did not serve the file: {error}")
                elif answer.get("offset") == offset and isinstance(
                    encoded := answer.get("data"), str
                ):
                    try:
                        data = base64.b64decode(encoded, validate=True)
                    except (binascii.Error, ValueError):
                        raise PushRefused("the edge sent data that is not base64") from None
                    if not data:
                        raise PushRefused(
                            f"the edge's file ends at {offset} bytes, not {order.size}"
                        )
                    return data[: order.size - offset]
            await trio.sleep(RETRY_AFTER)
    raise PushRefused(f"no edge served the file within {FETCH_WITHIN:g} s")


async def _report(link: EdgeLink, job: str, attempt: int, text: str, code: int) -> None:
    """TEXT as the part's output and CODE as its exit, until the edge has them both."""
    data = text.encode()
    output: Message = {
        "job": job, "attempt": attempt, "seq": 0, "stream": "stdout",
        "data": base64.b64encode(data).decode("ascii"), "truncated": False,
    }  # fmt: skip
    done = AttemptDone(
        job, attempt, result=AttemptResult(exit_code=code, output_bytes=len(data))
    ).to_wire()
    with trio.move_on_after(REPORT_WITHIN):
        for kind, fields, key in (
            ("job_output", output, (OUTPUT_ACK, job, attempt, 0)),
            (DONE, done, (DONE_ACK, job, attempt)),
        ):
            while True:
                try:
                    ack = await link.exchange(kind, fields, key, PIECE_TIMEOUT)
                except LinkDown:
                    ack = None
                if ack is not None and (ack.get("stored") is True or ack.get("reason") == "ended"):
                    break
                await trio.sleep(RETRY_AFTER)
        return
    log.warning("job %s attempt %d: no server took its end; not reported", job, attempt)
