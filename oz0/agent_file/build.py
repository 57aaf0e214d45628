"""Build the agent as one file: `python oz0/agent_file/build.py --out dist/oz0-node`.

The file is a zip application (the standard library's `zipapp`) for `/usr/bin/env python3`:
`__main__.py` (bootstrap.py) unpacks the packages into the node's data directory at its
first start. It carries the agent (oz0_node, oz0_common) and the wheels of
requirements/agent.txt for this platform: pure and abi3 wheels once, and the few that are
built for one Python version (cffi) once for each of Python 3.11-3.14, so it runs on any
of them. Standard library only, so setup.py can run it while the package installs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipapp
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
REQUIREMENTS = REPO / "requirements" / "agent.txt"
AGENT_PACKAGES = ("oz0_node", "oz0_common")
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
# Wheels for glibc 2.28 and newer (Debian 10, RHEL 8, Ubuntu 20.04 on): older machines
# cannot run the agent file.
GLIBC = "2.28"
HASH_LENGTH = 16


class BuildError(Exception):
    pass


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise BuildError(f"pip failed ({done.returncode}): {' '.join(command)}")


def _platforms() -> list[str]:
    machine = platform.machine()
    if sys.platform != "linux":
        raise BuildError(f"the agent file is built for Linux, not {sys.platform}")
    # pip takes platform tags literally: name every glibc from ours down, and the old aliases.
    newest = int(GLIBC.split(".")[1])
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(newest, 4, -1)]
    return [
        *tags,
        *(f"{alias}_{machine}" for alias in ("manylinux2014", "manylinux2010", "manylinux1")),
    ]


def _wheel_tags(dist_info: Path) -> list[str]:
    lines = (dist_info / "WHEEL").read_text().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:")]


def _per_version(dist_info: Path) -> bool:
    """Built for one Python version: no tag of it is pure (none) or the stable ABI (abi3)."""
    return all(tag.split("-")[1] not in ("none", "abi3") for tag in _wheel_tags(dist_info))


def _name_version(dist_info: Path) -> tuple[str, str]:
    fields = dict(
        line.split(": ", 1)
        for line in (dist_info / "METADATA").read_text().splitlines()
        if ": " in line and not line.startswith(" ")
    )
    return fields["Name"], fields["Version"]


def _remove_dist(site: Path, dist_info: Path) -> None:
    """Delete one installed distribution's files (as its RECORD lists them) from SITE."""
    for line in (dist_info / "RECORD").read_text().splitlines():
        name = line.rsplit(",", 2)[0]
        path = site / name
        if path.is_file():
            path.unlink()
    shutil.rmtree(dist_info, ignore_errors=True)
    for directory in sorted(site.rglob("*"), reverse=True):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def _prune(tree: Path) -> None:
    # Scripts of the installed tools and bytecode for one Python: the agent needs neither.
    shutil.rmtree(tree / "bin", ignore_errors=True)
    for cache in list(tree.rglob("__pycache__")):
        shutil.rmtree(cache)


def stage(work: Path) -> dict[str, object]:
    """Lay out the archive's contents in WORK; return its manifest."""
    site = work / "site-packages"
    platforms = [arg for p in _platforms() for arg in ("--platform", p)]
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    _pip(
        "install",
        "--target",
        str(site),
        "--only-binary=:all:",
        "--no-compile",
        "--python-version",
        version,
        *platforms,
        "-r",
        str(REQUIREMENTS),
    )
    for package in AGENT_PACKAGES:
        shutil.copytree(REPO / package, site / package)
    _prune(site)

    layers: dict[str, list[str]] = {}
    pinned = []
    for dist_info in sorted(site.glob("*.dist-info")):
        if _per_version(dist_info):
            name, dist_version = _name_version(dist_info)
            pinned.append(f"{name}=={dist_version}")
            _remove_dist(site, dist_info)
    pythons = []
    for python in PYTHONS:
        tag = "cp" + python.replace(".", "")
        if pinned:
            layer = work / tag
            try:
                _pip(
                    "install",
                    "--target",
                    str(layer),
                    "--no-deps",
                    "--only-binary=:all:",
                    "--no-compile",
                    "--python-version",
                    python,
                    "--implementation",
                    "cp",
                    "--abi",
                    tag,
                    *platforms,
                    *pinned,
                )
            except BuildError as e:
                print(f"warning: no Python {python} in the agent file: {e}", file=sys.stderr)
                shutil.rmtree(layer, ignore_errors=True)
                continue
            _prune(layer)
            layers[tag] = pinned
        pythons.append(tag)
    if f"cp{version.replace('.', '')}" not in pythons:
        raise BuildError(f"the agent file would not run on this Python ({version})")

    shutil.copy2(Path(__file__).with_name("bootstrap.py"), work / "__main__.py")
    shutil.copy2(REPO / "oz0_common" / "datadir.py", work / "_oz0_data_dir.py")
    shutil.copy2(REPO / "oz0_common" / "strict_modes.py", work / "_oz0_strict_modes.py")
    manifest: dict[str, object] = {
        "hash": content_hash(work),
        "pythons": pythons,
        "layers": sorted(layers),
        "built_with": platform.python_version(),
    }
    (work / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def content_hash(tree: Path) -> str:
    """What names a build: its files' names, exec bits and bytes (not their timestamps)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        relative = path.relative_to(tree).as_posix()
        executable = "x" if os.access(path, os.X_OK) else "-"
        digest.update(f"{relative}\0{executable}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:HASH_LENGTH]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(out: Path) -> str:
    """Write OUT (executable) and OUT.sha256 (`sha256sum` format); return the SHA-256."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oz0-node-build-") as tmp:
        work = Path(tmp) / "app"
        work.mkdir()
        stage(work)
        partial = out.with_name(f".{out.name}.partial")
        zipapp.create_archive(work, partial, interpreter="/usr/bin/env python3", compressed=True)
        partial.chmod(0o755)
        partial.replace(out)
    sha = file_sha256(out)
    out.with_name(out.name + ".sha256").write_text(f"{sha}  {out.name}\n")
    return sha


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "oz0-node")
    args = parser.parse_args()
    try:
        sha = build(args.out)
    except BuildError as e:
        sys.exit(f"error: {e}")
    size = args.out.stat().st_size
    print(f"built {args.out} ({size / 1e6:.1f} MB), sha256 {sha}")


if __name__ == "__main__":
    main()
