"""A SaltStack fleet on this machine for bench.salt_side_by_side: its own venv, one
salt-master on a loopback address of its own and minions node-1..node-M, every file in a
directory of the run's.

Salt runs as it comes out of the box but for what a fleet on one machine needs: paths under
the run's directory (`root_dir`), the master's address, keys accepted as they come
(`auto_accept`) and no DNS look-ups for grains (`enable_fqdns_grains`: this machine has no
resolver for its loopback names, and each minion would wait on them at start). Each
process is started in a session of its own so that stopping it stops the workers it forked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.runner import log

SALT_SPEC = "salt==3008.*"
DEFAULT_VENV = Path("/work/salt-venv")
# Salt's own defaults (both unprivileged).
PUBLISH_PORT = 4505
RET_PORT = 4506
INSTALL_TIMEOUT = 1200.0
MASTER_UP_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
PING_TIMEOUT = 10  # `salt -t`: how long one ping round waits for the minions' returns
VERSION_TIMEOUT = 60.0


class SaltFailed(Exception):
    """Salt could not be installed, started or reached."""


def ensure_venv(venv: Path) -> str:
    """Salt's venv at VENV (made and filled with SALT_SPEC when it has no salt); the
    version that `salt --version` prints. Never the project's own venv."""
    if venv.resolve() == Path(sys.prefix).resolve():
        raise SaltFailed(f"{venv} is the project's own venv: Salt goes into a venv of its own")
    if not (venv / "bin" / "salt").exists():
        log(f"installing {SALT_SPEC} into {venv} (a few minutes)")
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", SALT_SPEC],
        ]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise SaltFailed(f"{' '.join(step)} took over {INSTALL_TIMEOUT} s") from None
            if done.returncode != 0:
                raise SaltFailed(f"{' '.join(step)} failed:\n{done.stderr[-2000:]}")
    done = subprocess.run(
        [str(venv / "bin" / "salt"), "--version"],
        capture_output=True,
        text=True,
        timeout=VERSION_TIMEOUT,
    )
    if done.returncode != 0 or not done.stdout.startswith("salt "):
        raise SaltFailed(f"{venv}/bin/salt --version: {done.stdout}{done.stderr[-1000:]}")
    version = done.stdout.split()[1]
    if not version.startswith("3008."):
        raise SaltFailed(f"{venv} has salt {version}, not {SALT_SPEC}: remove the venv")
    return version


def _yaml(values: dict[str, object]) -> str:
    """A flat YAML mapping (JSON values are YAML): what Salt's config files need here."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items())


def _stop_groups(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each of PROCESSES' own sessions (it and the workers it forked), all at
    once; SIGKILL to every process of them left after STOP_TIMEOUT, counted once for all
    (one wait each, one after the other, once took minutes with 50 minions)."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
    # Workers that outlived their leader still carry its group ID: the leader's own (it was
    # never reused while we held it unreaped, and these keep the group alive).
    groups = {process.pid for process in processes}
    for pid in _group_members(groups):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(1.0, deadline + STOP_TIMEOUT - time.monotonic()))


def _group_members(pgids: set[int]) -> list[int]:
    """The processes whose process group is one of PGIDS (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # After the command: state, ppid, pgrp.
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) in pgids:
                members.append(int(stat.parent.name))
    return members


@dataclass(eq=False)
class SaltFleet:
    venv: Path
    root: Path
    address: str
    master: subprocess.Popen[bytes] | None = None
    minions: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def config_dir(self) -> Path:
        """The master's configuration directory: what `salt -c` is given."""
        return self.root / "master"

    def command(self, *args: str) -> list[str]:
        """`salt ARGS...` as an operator on the master's machine types it (plus `-c`)."""
        return [str(self.venv / "bin" / "salt"), "-c", str(self.config_dir), *args]

    def start_master(self) -> None:
        self.config_dir.mkdir(parents=True)
        (self.config_dir / "master").write_text(
            _yaml(
                {
                    "interface": self.address,
                    "publish_port": PUBLISH_PORT,
                    "ret_port": RET_PORT,
                    "root_dir": str(self.root / "master-root"),
                    "user": "root",
                    "auto_accept": True,
                    "log_level_logfile": "warning",
                }
            )
        )
        self.master = self._start("salt-master", self.config_dir, self.root / "master.log")
        deadline = time.monotonic() + MASTER_UP_TIMEOUT
        while not all(self._listening(port) for port in (PUBLISH_PORT, RET_PORT)):
            if self.master.poll() is not None:
                raise SaltFailed(f"salt-master exited:\n{self._tail('master.log')}")
            if time.monotonic() > deadline:
                raise SaltFailed(f"salt-master not listening within {MASTER_UP_TIMEOUT} s")
            time.sleep(0.2)

    def add_minions(self, upto: int, timeout: float) -> float:
        """Minions node-(len+1)..node-UPTO, started; once every minion answers a ping
        (keys accepted, connected). The seconds it took."""
        began = time.monotonic()
        for index in range(len(self.minions) + 1, upto + 1):
            name = f"node-{index}"
            config = self.root / name
            config.mkdir(parents=True)
            (config / "minion").write_text(
                _yaml(
                    {
                        "id": name,
                        "master": self.address,
                        "master_port": RET_PORT,
                        "publish_port": PUBLISH_PORT,
                        "root_dir": str(config / "root"),
                        "user": "root",
                        "enable_fqdns_grains": False,
                        "log_level_logfile": "warning",
                    }
                )
            )
            self.minions.append(self._start("salt-minion", config, self.root / f"{name}.log"))
        deadline = time.monotonic() + timeout
        while True:
            answered = self.ping()
            if answered >= upto:
                return time.monotonic() - began
            dead = [i + 1 for i, m in enumerate(self.minions) if m.poll() is not None]
            if dead:
                raise SaltFailed(f"salt-minion node-{dead[0]} exited:\n"
                                 f"{self._tail(f'node-{dead[0]}.log')}")  # fmt: skip
            if time.monotonic() > deadline:
                raise SaltFailed(f"only {answered} of {upto} minions answered in {timeout} s")
            log(f"salt: {answered} of {upto} minions answer")
            time.sleep(2.0)

    def ping(self) -> int:
        """How many minions answer `test.ping` within PING_TIMEOUT."""
        try:
            done = subprocess.run(
                self.command("--out=json", "--static", "-t", str(PING_TIMEOUT), "*", "test.ping"),
                capture_output=True,
                text=True,
                timeout=PING_TIMEOUT + 60,
            )
        except subprocess.TimeoutExpired:
            return 0
        try:
            answers = json.loads(done.stdout or "{}")
        except ValueError:
            return 0
        return sum(value is True for value in answers.values()) if isinstance(answers, dict) else 0

    def pids(self) -> list[int]:
        """The leaders of the master's and each minion's session (for memory and CPU)."""
        return [p.pid for p in [self.master, *self.minions] if p is not None]

    def stop(self) -> None:
        """Every minion, then the master, each with what it forked: within 2 to 3 times
        STOP_TIMEOUT, however many minions there are."""
        _stop_groups(self.minions)
        if self.master is not None:
            _stop_groups([self.master])

    def _start(self, program: str, config: Path, log_path: Path) -> subprocess.Popen[bytes]:
        """PROGRAM with its configuration directory CONFIG, which is also its working
        directory: what a minion writes to a relative path (`salt-cp '*' FILE NAME`) is its
        own, not every minion's one file."""
        with log_path.open("ab") as out:
            return subprocess.Popen(
                [str(self.venv / "bin" / program), "-c", str(config), "-l", "warning"],
                cwd=config,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def _listening(self, port: int) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.address, port), 1):
            return True
        return False

    def _tail(self, name: str) -> str:
        path = self.root / name
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""
