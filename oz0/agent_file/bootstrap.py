"""The agent file's `__main__`: unpack what it carries into DIR/python/<hash>/, then run the
agent from there.

Native code (cryptography, cffi, temporalio's Rust core) cannot be imported from inside a
zip, so the packages are unpacked once per build (the hash names the build's contents)
into the node's data directory, where a purge deletes them with the rest of the node.
Nothing goes to ~/.cache or the temp directory. Standard library only; it must run on
the oldest Python it refuses, to say so.

Under strict modes (oz0_common.strict_modes, carried as `_oz0_strict_modes`): a data
directory that is a symbolic link, or that (or a directory above it), DIR/python/, its
build's directory or a layer is owned by another user or writable by others, is refused
with one line and nothing runs. Each layer holds RECORD, written before it was renamed into
place: the build's hash and every file's and directory's (path, size, mtime, mode). A layer
that differs from its record (or has none) is moved aside and unpacked again, with one line
saying so; Python's own bytecode caches (`__pycache__`) are left out of the record.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import zipfile
from pathlib import Path

MIN_PYTHON = (3, 11)
MANIFEST = "bundle.json"
COMMON_LAYER = "site-packages"
RECORD = ".oz0-layer.json"
# Written by Python at import: the one thing in a layer that is not the archive's.
BYTECODE_DIR = "__pycache__"


class BootstrapError(Exception):
    pass


def layer_listing(layer: Path) -> list[list[object]]:
    """What LAYER holds, as its record keeps it: [path, size, mtime_ns, mode] of every entry
    (links too, never followed), sorted; bytecode caches and the record left out."""
    found: list[list[object]] = []
    # Plain strings and os.scandir: this runs at every start, over some 3000 entries.
    pending = [("", str(layer))]
    while pending:
        prefix, directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if name == BYTECODE_DIR or (name == RECORD and not prefix):
                    continue
                st = entry.stat(follow_symlinks=False)
                relative = prefix + name
                if stat.S_ISDIR(st.st_mode):
                    # A directory's size and mtime change as Python writes its bytecode.
                    found.append([relative, 0, 0, st.st_mode])
                    pending.append((relative + "/", entry.path))
                else:
                    found.append([relative, st.st_size, st.st_mtime_ns, st.st_mode])
    found.sort()
    return found


def layer_difference(layer: Path, build: str) -> str | None:
    """How LAYER differs from the record it was unpacked with, or None."""
    try:
        record = json.loads((layer / RECORD).read_text())
    except FileNotFoundError:
        return "holds no record of what was unpacked"
    except (OSError, ValueError) as e:
        return f"has an unreadable record ({e})"
    if not isinstance(record, dict) or record.get("build") != build:
        return f"has a record of another build than {build}"
    listing = layer_listing(layer)
    if listing == record.get("files"):
        return None
    recorded = {str(row[0]): row for row in record.get("files", [])}
    for row in listing:
        kept = recorded.pop(str(row[0]), None)
        if kept is None:
            return f"holds {row[0]}, which it was not unpacked with"
        if kept != row:
            return f"holds {row[0]} changed since it was unpacked"
    if recorded:
        return f"lacks {min(recorded)}"
    return None


def unpack_layer(archive: zipfile.ZipFile, root: Path, layer: str, build: str) -> Path:
    """ROOT/LAYER with the archive's LAYER/ entries and its RECORD; unpacked beside it and
    renamed into place, so a half-unpacked layer is never used and two agents starting at
    once agree. A layer already there is used as it is if it matches its record, else moved
    aside and unpacked again."""
    target = root / layer
    if target.is_dir() or target.is_symlink():
        check_dir(target)
        difference = layer_difference(target, build)
        if difference is None:
            return target
        print(f"oz0-node: {target} {difference}; unpacking it again", file=sys.stderr)
        aside = root / f".{layer}.{os.getpid()}.bad"
        target.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    # What the archive unpacks to is writable by the agent's user alone, whatever the umask.
    umask = os.umask(0o022)
    try:
        return _unpack_new(archive, root, layer, build)
    finally:
        os.umask(umask)


def _unpack_new(archive: zipfile.ZipFile, root: Path, layer: str, build: str) -> Path:
    target = root / layer
    staging = root / f".{layer}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    prefix = layer + "/"
    try:
        for info in archive.infolist():
            if not info.filename.startswith(prefix) or info.is_dir():
                continue
            relative = info.filename[len(prefix) :]
            path = staging / relative
            # The builder wrote the names; refuse any that would leave the staging directory.
            if ".." in Path(relative).parts or Path(relative).is_absolute():
                raise BootstrapError(f"the agent file holds a bad name: {info.filename!r}")
            path.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, path.open("wb") as dest:
                shutil.copyfileobj(source, dest)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                # Nothing the archive says makes a file writable by others.
                path.chmod(mode & ~0o022)
        staging.mkdir(parents=True, exist_ok=True)
        record = {"build": build, "files": layer_listing(staging)}
        (staging / RECORD).write_text(json.dumps(record, separators=(",", ":")))
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            # Another agent unpacked the same build first: use its copy.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_dir(path: Path) -> None:
    """Refuse PATH, a directory of the agent's own, unless it is one (not a link) and it and
    the directories above it are under strict modes."""
    import _oz0_strict_modes  # type: ignore[import-not-found]  # oz0_common/strict_modes.py

    if path.is_symlink():
        raise BootstrapError(
            f"refusing to run: {path} is a symbolic link; give the directory it leads to"
        )
    why: str | None = _oz0_strict_modes.refusal(path)
    if why is not None:
        raise BootstrapError(f"refusing to run: {why}")


def prepare(archive_path: Path, argv: list[str]) -> list[Path]:
    """Unpack the layers this Python needs; return them for sys.path."""
    import _oz0_data_dir  # type: ignore[import-not-found]  # a copy of oz0_common/datadir.py

    data_dir: Path = _oz0_data_dir.data_dir_in_argv(argv)
    with zipfile.ZipFile(archive_path) as archive:
        manifest = json.loads(archive.read(MANIFEST))
        tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        if tag not in manifest["pythons"]:
            carried = ", ".join(manifest["pythons"])
            raise BootstrapError(
                f"this agent file carries native code for {carried}, not for Python "
                f"{sys.version_info[0]}.{sys.version_info[1]} ({sys.executable})"
            )
        build = manifest["hash"]
        root = data_dir / "python" / build
        try:
            # Made here as the agent makes it, so a purge also removes the parents made.
            _oz0_data_dir.make_data_dir(data_dir)
            check_dir(data_dir)
            for directory in (root.parent, root):
                directory.mkdir(mode=0o700, exist_ok=True)
                check_dir(directory)
            layers = [unpack_layer(archive, root, COMMON_LAYER, build)]
            if tag in manifest["layers"]:
                layers.append(unpack_layer(archive, root, tag, build))
        except OSError as e:
            raise BootstrapError(
                f"cannot unpack the agent into {root}: {e.strerror or e} "
                f"(choose another place with --data-dir or {_oz0_data_dir.ENV_VAR})"
            ) from None
    return layers


def main() -> None:
    if sys.version_info < MIN_PYTHON:
        sys.exit(f"oz0-node: needs Python 3.11 or newer, and {sys.executable} is {sys.version}")
    archive_path = Path(__file__).resolve().parent
    try:
        layers = prepare(archive_path, sys.argv[1:])
    except BootstrapError as e:
        sys.exit(f"oz0-node: {e}")
    # The agent's own modules come from the unpacked copy, not the zip (it has no pyc cache).
    sys.path[:] = [str(p) for p in layers] + [
        p for p in sys.path if Path(p).resolve() != archive_path
    ]
    sys.modules.pop("_oz0_data_dir", None)
    sys.modules.pop("_oz0_strict_modes", None)
    from oz0_node.main import main as agent_main

    agent_main()


if __name__ == "__main__":
    main()
