"""Builds the Temporal host (Go) while the package is installed.

Servers need it; nodes install the same package without Go, so a missing Go toolchain
only warns here, and `server start` then says how to build the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOST_DIR = Path(__file__).resolve().parent / "oz0" / "temporal" / "host"


def build_temporal_host() -> None:
    if os.environ.get("OZ0_SKIP_TEMPORAL_HOST"):
        return
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
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


class BuildPyWithTemporalHost(build_py):
    def run(self) -> None:
        build_temporal_host()
        super().run()


setup(cmdclass={"build_py": BuildPyWithTemporalHost})
