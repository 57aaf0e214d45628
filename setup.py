"""Builds the Temporal host (Go) and the agent file while the package is installed.

Servers need both; a missing Go toolchain or a failed agent build only warns here, and
`server start` then says how to build what is missing. A wheel that carries the host is
for this platform alone (`nox -s wheel`): it installs a server where there is no Go.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
HOST_DIR = ROOT / "oz0" / "temporal" / "host"
AGENT_DIR = ROOT / "oz0" / "agent_file"
# What the agent file is made of; unchanged, a reinstall keeps the file it built before.
AGENT_INPUTS = ("requirements/agent.txt", "oz0_node", "oz0_common", "oz0/agent_file")


def _go() -> str | None:
    return shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )


def build_temporal_host() -> None:
    if os.environ.get("OZ0_SKIP_TEMPORAL_HOST"):
        return
    go = _go()
    if go is None:
        print(
            "warning: Go not found; the Temporal host was not built. Servers need it: "
            "install Go >= 1.26.4 and run oz0/temporal/host/build.sh",
            file=sys.stderr,
        )
        return
    print("building the Temporal host (the first build takes several minutes)", file=sys.stderr)
    env = dict(os.environ, PATH=f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    subprocess.run(["bash", str(HOST_DIR / "build.sh")], check=True, env=env)


def _agent_inputs_hash() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for name in AGENT_INPUTS:
        top = ROOT / name
        files = [top] if top.is_file() else sorted(top.rglob("*.py")) + sorted(top.rglob("*.txt"))
        for path in files:
            if "bin" not in path.relative_to(ROOT).parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_agent_file() -> None:
    if os.environ.get("OZ0_SKIP_AGENT_FILE"):
        return
    out = AGENT_DIR / "bin" / "oz0-node"
    stamp = out.with_name("oz0-node.inputs")
    inputs = _agent_inputs_hash()
    if out.is_file() and stamp.is_file() and stamp.read_text() == inputs:
        return
    print("building the agent file oz0-node", file=sys.stderr)
    done = subprocess.run([sys.executable, str(AGENT_DIR / "build.py"), "--out", str(out)])
    if done.returncode != 0:
        # A file built from other sources is not one to serve (or test) in its place.
        out.unlink(missing_ok=True)
        stamp.unlink(missing_ok=True)
        print(
            "warning: the agent file was not built; servers answer 404 for /agent/oz0-node "
            "until `python3 -m nox -s agent` builds it (see docs/manage-nodes.md)",
            file=sys.stderr,
        )
        return
    stamp.write_text(inputs)


class BuildPyWithTemporalHost(build_py):
    def run(self) -> None:
        build_temporal_host()
        build_agent_file()
        super().run()


def carries_host() -> bool:
    """Whether what is built holds the Temporal host (one built before, or one Go builds
    now): decided before anything is built, since it decides where setuptools builds and
    installs (a platform's directory)."""
    if (HOST_DIR / "bin" / "oz0-temporal-host").is_file():
        return True
    return not os.environ.get("OZ0_SKIP_TEMPORAL_HOST") and _go() is not None


class ForThisPlatform(Distribution):
    """With the host, the package is for this machine's platform: a Go program inside."""

    def has_ext_modules(self) -> bool:
        return carries_host()


class WheelForThisPlatform(bdist_wheel):
    """Nothing in the package is built against Python (the host is a Go program, the agent
    file a zip application), so its wheel is for any Python 3 on this platform:
    py3-none-PLATFORM, not one CPython's tag."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        return (python, abi, platform) if self.root_is_pure else ("py3", "none", platform)


setup(
    distclass=ForThisPlatform,
    cmdclass={"build_py": BuildPyWithTemporalHost, "bdist_wheel": WheelForThisPlatform},
)
