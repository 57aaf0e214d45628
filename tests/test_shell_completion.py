"""Shell completion (cli/completion_cmds.py, cli/completers.py): bash, driven through a real
terminal (tmux), completes commands and the node IDs of a real server's cluster once
`--install-completion` has put its script in ~/.bashrc; `__complete` (what the script
asks) answers each kind of ID from the cluster; a server that never answers costs a TAB
the deadline, not the client's timeouts, and prints nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from cli import completers
from fixtures import edge_client
from fixtures.cluster import REPO, Served, cli_command
from oz0.context import Context

ADVERTISE = "127.0.0.58"
EDGE = f"{ADVERTISE}:7443"
PROGRAM = "orchestrator-zero"
BEGIN = "\x1fbegin"


@dataclass(frozen=True)
class Cluster:
    """What the module's cluster holds, for completion to find."""

    env: dict[str, str]
    nodes: dict[str, str]  # ID: host name
    job: str
    token: str
    schedule: str


def _oz0(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), env=env, capture_output=True, text=True, timeout=60)


def _made(env: dict[str, str], *args: str) -> str:
    """The ID of what ARGS (with their --json) made."""
    done = _oz0(env, *args)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


async def _join(token: str, hostnames: tuple[str, ...]) -> dict[str, str]:
    joined: dict[str, str] = {}
    for hostname in hostnames:
        keys = edge_client.NodeKeys.new()
        keys.ca_pem, _ = await edge_client.fetch_ca(EDGE)
        answer = await edge_client.join(EDGE, keys, token=token, hostname=hostname)
        assert answer.get("state") == "accepted", answer
        joined[keys.node_id] = hostname
    return joined


@pytest.fixture(scope="module")
def cluster(served: Served) -> Cluster:
    env = {**os.environ, **served.files.cli_env, "PYTHONPATH": str(REPO)}
    assert _oz0(env, "tenant", "create", "acme").returncode == 0
    secret = _oz0(env, "token", "create", "--tenant", "default", "--max-uses", "0", "--json")
    assert secret.returncode == 0, secret.stderr
    created = json.loads(secret.stdout)
    nodes = trio.run(_join, str(created["token"]), ("web-1", "web-2"))
    node = next(iter(nodes))
    # Queued for a node that is not connected: it stays, for `job show` to complete.
    job = _made(env, "job", "run", "--detach", "--json", "--node", node, "--", "true")
    # Once a year: no run of it joins the job above in `job show <TAB>`.
    yearly = ("--cron", "0 3 1 1 *")
    schedule = _made(env, "schedule", "create", *yearly, "--json", "--", "true")
    return Cluster(env, nodes, job, str(created["id"]), schedule)


def complete(
    env: dict[str, str], *words: str
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """The values `orchestrator-zero __complete WORDS` offers, as the shell script reads
    them: the lines after the begin mark, each's value before its tab."""
    done = _oz0(env, "__complete", *words)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert BEGIN in lines, done.stdout
    records = lines[lines.index(BEGIN) + 1 :]
    return [line.split("\t")[0] for line in records if line and not line.startswith("\x1f")], done


def test_each_kind_of_id_completes_from_the_cluster(cluster: Cluster) -> None:
    env = cluster.env
    nodes = sorted(cluster.nodes)
    began = time.monotonic()
    assert sorted(complete(env, "node", "show", "")[0]) == nodes
    # What a TAB costs the shell here: an interpreter's start and one request.
    print(f"__complete node show: {time.monotonic() - began:.2f} s")
    assert sorted(complete(env, "node", "block", nodes[0], "")[0]) == nodes
    assert sorted(complete(env, "job", "run", "--node", "")[0]) == nodes
    # The typed prefix narrows what the cluster is asked for.
    assert complete(env, "node", "show", nodes[1])[0] == [nodes[1]]
    assert complete(env, "job", "show", "")[0] == [cluster.job]
    assert complete(env, "job", "cancel", "")[0] == [cluster.job]
    assert complete(env, "token", "revoke", "")[0] == [cluster.token]
    assert complete(env, "schedule", "pause", "")[0] == [cluster.schedule]
    assert complete(env, "job", "list", "--schedule", "")[0] == [cluster.schedule]
    assert sorted(complete(env, "tenant", "show", "")[0]) == ["acme", "default"]
    assert sorted(complete(env, "token", "create", "--tenant", "")[0]) == ["acme", "default"]
    # zsh and fish show each ID's description: the node's host name.
    described = _oz0(env, "__complete", "node", "show", "").stdout
    assert {f"{n}\t{h} accepted" for n, h in cluster.nodes.items()} <= set(described.splitlines())


def test_no_context_or_a_silent_server_gives_nothing_within_the_deadline(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = {k: v for k, v in cluster.env.items() if k != "OZ0_CONTEXT"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "none")
    values, done = complete(env, "node", "show", "")
    assert (values, done.stderr) == ([], "")

    # Two servers that take the connection and never say a word: the client would wait
    # for each in turn (cli/client.py's CONNECT_TIMEOUT), the shell must not.
    listeners = [socket.create_server((ADVERTISE, 0)) for _ in range(2)]
    try:
        source = Context.load(Path(cluster.env["OZ0_CONTEXT"]))
        copy = tmp_path / "silent"
        shutil.copytree(source.directory, copy)
        servers = tuple(f"{ADVERTISE}:{s.getsockname()[1]}" for s in listeners)
        dataclasses.replace(
            source, directory=copy, servers=servers, learned=(), learned_at=None
        ).save()
        began = time.monotonic()
        values, done = complete(
            {**env, "OZ0_CONTEXT": str(copy / "context.json")}, "node", "show", ""
        )
        took = time.monotonic() - began
    finally:
        for listener in listeners:
            listener.close()
    assert (values, done.stderr) == ([], "")
    # The deadline and an interpreter's start, with room for a busy machine; far below the
    # 2 x 10 s the client alone would take.
    assert took < completers.DEADLINE + 5, took


class Terminal:
    """A tmux server of the test's own (its socket in the test's directory), one window."""

    def __init__(self, directory: Path) -> None:
        self.tmux = ["tmux", "-S", str(directory / "tmux.sock"), "-f", "/dev/null"]

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [*self.tmux, *args], capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout

    def start(self, command: list[str]) -> None:
        self._run("new-session", "-d", "-s", "oz0", "-x", "200", "-y", "50", *command)

    def type(self, text: str) -> None:
        self._run("send-keys", "-t", "oz0", "-l", text)

    def press(self, *keys: str) -> None:
        self._run("send-keys", "-t", "oz0", *keys)

    def fresh_line(self) -> None:
        """An empty command line on a cleared screen: what was shown cannot match again."""
        self.press("C-u", "C-l")
        self.wait(r"\A\S.*\s*\Z")

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-J", "-t", "oz0")

    def wait(self, pattern: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if re.search(pattern, screen, re.M):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on the screen in {timeout} s:\n{screen}")
            time.sleep(0.2)

    def complete_until(self, pattern: str, tabs: int = 3) -> str:
        """TAB until PATTERN shows: bash's first may only insert the candidates' common
        prefix, and lists them at the next."""
        for _ in range(tabs):
            self.press("Tab")
            try:
                return self.wait(pattern, timeout=10)
            except AssertionError:
                continue
        raise AssertionError(f"{pattern!r} never shown:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        pytest.skip("no tmux (apt-get install tmux)")
    opened = Terminal(tmp_path)
    yield opened
    opened.close()


def _user(tmp_path: Path, cluster: Cluster, shell: str) -> tuple[Path, dict[str, str]]:
    """A user of the cluster with a HOME of their own, the command on their PATH (this
    checkout's, as a console script runs it) and SHELL's completion installed the way the
    docs say; their HOME and environment."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    program = bin_dir / PROGRAM
    program.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cli.main "$@"\n')
    program.chmod(0o755)
    (home / ".inputrc").write_text("set bell-style none\nset show-all-if-ambiguous on\n")
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        # No XDG_CONFIG_HOME: fish would look there, not in ~/.config, for completions.
        "OZ0_CONTEXT": cluster.env["OZ0_CONTEXT"],
        "INPUTRC": str(home / ".inputrc"),
        "TERM": "xterm",
        "LANG": "C.UTF-8",
    }
    installed = subprocess.run(
        [str(program), "--install-completion", "--shell", shell],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert f"{shell} completion written to" in installed.stdout
    return home, env


def _interactive(terminal: Terminal, env: dict[str, str], shell: str) -> None:
    """SHELL, interactive, started from ENV alone: it reads the temporary HOME's start-up
    files and nothing of this machine's user."""
    terminal.start(["env", "-i", *(f"{k}={v}" for k, v in env.items()), shell, "-i"])
    terminal.type("echo ready-42")
    terminal.press("Enter")
    terminal.wait(r"^ready-42\s*$")


def _all_of(words: list[str]) -> str:
    return "(?s)" + "".join(f"(?=.*{re.escape(word)})" for word in words)


def test_bash_completes_commands_and_the_clusters_node_ids_in_a_terminal(
    cluster: Cluster, tmp_path: Path, terminal: Terminal
) -> None:
    home, env = _user(tmp_path, cluster, "bash")
    assert PROGRAM in (home / ".bashrc").read_text()
    _interactive(terminal, env, "bash")

    # A command: `no` has one completion.
    terminal.fresh_line()
    terminal.type(f"{PROGRAM} no")
    terminal.press("Tab")
    terminal.wait(rf"{PROGRAM} node\s*$")

    # The cluster's node IDs.
    terminal.fresh_line()
    terminal.type(f"{PROGRAM} node show ")
    terminal.complete_until(_all_of(sorted(cluster.nodes)))

    # A flag, then the cluster's tenants as its value.
    terminal.fresh_line()
    terminal.type(f"{PROGRAM} node list --ten")
    terminal.press("Tab")
    terminal.wait(rf"{PROGRAM} node list --tenant\s*$")
    terminal.complete_until(r"(?s)--tenant\s.*\bacme\s+default\b")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_complete_the_clusters_node_ids_in_a_terminal(
    cluster: Cluster, tmp_path: Path, terminal: Terminal, shell: str
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} (apt-get install {shell})")
    home, env = _user(tmp_path, cluster, shell)
    if shell == "zsh":
        # What a .zshrc has after the fpath line --install-completion put at its top.
        with (home / ".zshrc").open("a") as zshrc:
            zshrc.write("autoload -Uz compinit && compinit -u\n")
    _interactive(terminal, env, shell)
    terminal.fresh_line()
    terminal.type(f"{PROGRAM} node show ")
    # Each ID with its host name beside it.
    terminal.complete_until(_all_of([*cluster.nodes, *cluster.nodes.values()]))


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_complete_the_cluster_ids(tmp_path: Path, shell: str) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    for key in ("ZSH", "ZSH_CUSTOM"):
        env.pop(key, None)
    done = _oz0(env, "--install-completion", "--shell", shell, "--json")
    assert done.returncode == 0, done.stderr
    script = Path(json.loads(done.stdout)["script"])
    assert script.is_relative_to(tmp_path)
    text = script.read_text()
    # `node show`'s argument is completed by the script's callback to `__complete`.
    if shell == "zsh":
        assert "'1:NODE_ID:_cyclopts_orchestrator-zero_complete'" in text
    else:
        assert any(
            "_using_command node show;" in line and "(__fish_orchestrator-zero_complete)" in line
            for line in text.splitlines()
        )
    assert f"{PROGRAM} __complete" in text or "$_cyc_cmd __complete" in text
    if shell == "zsh":
        assert str(script.parent) in (tmp_path / ".zshrc").read_text()
    checker = {"zsh": ["zsh", "-n"], "fish": ["fish", "--no-execute"]}[shell]
    if shutil.which(checker[0]) is not None:
        checked = subprocess.run(
            [*checker, str(script)], capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stderr
