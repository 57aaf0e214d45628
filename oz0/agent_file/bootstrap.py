"""The agent file's `__main__`: unpack what it carries into DIR/python/<hash>/, then run the
agent from there.

Native code (cryptography, cffi, temporalio's Rust core) cannot be imported from inside a
zip, so the packages are unpacked once per build (the hash names the build's contents)
into the node's data directory, where a purge deletes them with the rest of the node.
Nothing goes to ~/.cache or the temp directory. Standard library only; it must run on
the oldest Python it refuses, to say so.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

MIN_PYTHON = (3, 11)
MANIFEST = "bundle.json"
COMMON_LAYER = "site-packages"


class BootstrapError(Exception):
    pass


def unpack_layer(archive: zipfile.ZipFile, root: Path, layer: str) -> Path:
    """ROOT/LAYER with the archive's LAYER/ entries; unpacked beside it and renamed into
    place, so a half-unpacked layer is never used and two agents starting at once agree."""
    target = root / layer
    if target.is_dir():
        return target
    for directory in (root.parent, root):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
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
                path.chmod(mode)
        staging.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            # Another agent unpacked the same build first: use its copy.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


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
        root = data_dir / "python" / manifest["hash"]
        try:
            # Made here as the agent makes it, so a purge also removes the parents made.
            _oz0_data_dir.make_data_dir(data_dir)
            layers = [unpack_layer(archive, root, COMMON_LAYER)]
            if tag in manifest["layers"]:
                layers.append(unpack_layer(archive, root, tag))
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
    from oz0_node.main import main as agent_main

    agent_main()


if __name__ == "__main__":
    main()
