"""Interactive sessions end to end (docs/sessions.md), on a real server, real Temporal, a
real agent as root and the real CLI on a real PTY (pexpect) (127.0.0.25): a shell that
runs `stty size` at its window's size, follows a resize, is interrupted by Ctrl-C and
returns `exit 3`'s 3; it runs as a UID of its own; a block ends a session within the
product's 2 s; a viewer may not open one."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest
from playwright.sync_api import expect

from fixtures import operator_certs
from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import REPO, Served, cli_command, run_cli
from oz0.context import CONTEXT_FILE
from oz0_node.jobs.attempt_uids import DEFAULT_RANGE
from tests.web_support import browser, checked_shot, click_to_load, shots, signed_in_watched

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sessions given UIDs)"),
]

__all__ = ["browser"]  # the fixture, used by name
ADVERTISE = "127.0.0.25"
# The block's bound (the product documents'), and what starting the CLI adds to its end.
BLOCK_BOUND = 2.0


# The account sessions may run as on the module's node (--session-users), and one not listed.
SESSION_USER, NOT_LISTED = "daemon", "bin"


@dataclass
class Running:
    """The module's agent (a test may restart it: the one running now)."""

    agent: AgentProcess


@pytest.fixture(scope="module")
def session_agent(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One agent joined to the module's server, running, allowing sessions as
    SESSION_USER."""
    env = served.files.cli_env
    made = run_cli(env, "token", "create", "--tenant", "default", "--json")
    assert made.returncode == 0, made.stderr
    agent = AgentProcess.joining(
        tmp_path_factory.mktemp("agent") / "node",
        [f"{ADVERTISE}:7443"],
        served.files.ca_hash,
        token=json.loads(made.stdout)["token"],
    )
    agent.args += ["--session-users", SESSION_USER]
    holder = Running(agent.start())
    try:
        status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
        assert status["jobs"]["session_users"] == [SESSION_USER]
        yield holder
    finally:
        stop_all([holder.agent])


@pytest.fixture(scope="module")
def node(session_agent: Running) -> str:
    """The module's agent's node ID."""
    return str(session_agent.agent.status()["node_id"])


def wait_connected(env: dict[str, str], node: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = run_cli(env, "node", "show", node, "--json")
        if shown.returncode == 0 and json.loads(shown.stdout)["connected"]:
            return
        time.sleep(0.3)
    raise AssertionError(f"node {node} did not reconnect in {timeout} s")


def audit_rows(env: dict[str, str], action: str) -> list[dict[str, Any]]:
    listed = run_cli(env, "audit", "list", "--action", action, "--json")
    assert listed.returncode == 0, listed.stderr
    entries: list[dict[str, Any]] = json.loads(listed.stdout)
    return entries


def node_shell(
    served: Served, node: str, preexec_fn: Callable[[], object] | None = None
) -> pexpect.spawn:
    """`node shell NODE` in the real CLI on a PTY of 31 x 97 (PREEXEC_FN runs in the CLI's
    process before it starts)."""
    env = {**os.environ, **served.files.cli_env, "PYTHONPATH": str(REPO), "TERM": "xterm"}
    return pexpect.spawn(
        sys.executable,
        ["-m", "cli.main", "node", "shell", node],
        env=env,
        dimensions=(31, 97),
        timeout=30,
        encoding="utf-8",
        preexec_fn=preexec_fn,
    )


def test_a_shell_on_a_real_terminal_sizes_resizes_interrupts_and_returns_its_exit_code(
    served: Served, node: str
) -> None:
    seen = io.StringIO()
    shell = node_shell(served, node)
    shell.logfile_read = seen
    try:
        # The prompt: the session is up and this terminal raw (typed keys echo remotely only).
        shell.expect(r"[$#] ")
        # $((...)): the echo of the typed line never matches, only the shell's answer.
        shell.sendline("echo ready-$((40+2))")
        shell.expect("ready-42")
        shell.sendline("stty size; echo uid-$(id -u)")
        shell.expect(r"31 97\s+uid-(\d+)")
        assert int(shell.match.group(1)) in range(DEFAULT_RANGE.first, DEFAULT_RANGE.last + 1)
        shell.setwinsize(44, 120)
        time.sleep(0.5)  # SIGWINCH reaches the CLI, the resize the node
        shell.sendline("stty size")
        shell.expect(r"44 120")
        # Its terminal is its controlling terminal (else no job control, no Ctrl-C).
        shell.sendline("""awk '{print "ctty-" ($7 != 0)}' /proc/$$/stat""")
        shell.expect("ctty-1")
        shell.sendline("sleep 60; echo not-$((1))-interrupted")
        time.sleep(1)
        began = time.monotonic()
        shell.sendintr()
        shell.sendline("echo after-$((2+3))")
        shell.expect("after-5")
        assert time.monotonic() - began < 10
        assert "not-1-interrupted" not in (shell.before or "")
        shell.sendline("exit 3")
        shell.expect(pexpect.EOF)
    finally:
        shell.close()
    assert shell.exitstatus == 3, shell.before
    [started, *_] = audit_rows(served.files.cli_env, "session.start")
    assert started["details"]["node"] == node
    ends = audit_rows(served.files.cli_env, "session.end")
    ended = [e for e in ends if e["target"] == started["target"]]
    assert ended and ended[0]["details"]["exit_code"] == 3
    assert ended[0]["details"]["output_bytes"] > 0

    # The recording replays to the very output the person saw, and is listed.
    session_id = started["target"]
    cast = run_cli(served.files.cli_env, "session", "play", session_id, "--cast")
    assert cast.returncode == 0, cast.stderr
    header, *events = (json.loads(line) for line in cast.stdout.splitlines())
    assert (header["version"], header["width"], header["height"]) == (2, 97, 31)
    assert "".join(e[2] for e in events if e[1] == "o") == seen.getvalue()
    assert ["r", "120x44"] in [e[1:] for e in events]
    times = [e[0] for e in events]
    assert times == sorted(times) and times[-1] > 1.0
    played = run_cli(served.files.cli_env, "session", "play", session_id, "--speed", "1000")
    assert played.returncode == 0, played.stderr
    # (Read as text: its line ends as Python's universal newlines make them.)
    assert played.stdout == seen.getvalue().replace("\r\n", "\n").replace("\r", "\n")
    listed = run_cli(served.files.cli_env, "session", "list", "--node", node, "--json")
    [row] = [r for r in json.loads(listed.stdout) if r["id"] == session_id]
    assert (row["person"], row["exit_code"], row["live"]) == ("admin", 3, False)
    assert row["output_bytes"] == len(seen.getvalue().encode())


def test_keys_typed_after_a_resize_reach_the_node_after_it(served: Served, node: str) -> None:
    """The CLI's SIGWINCH held back (blocked in it: a loaded machine delays it), the keys
    typed after a resize still reach the node after the resize."""
    shell = node_shell(
        served,
        node,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH}),
    )
    try:
        shell.expect(r"[$#] ")
        shell.setwinsize(44, 120)
        shell.sendline("stty size")
        shell.expect(r"(\d+ \d+)\s")
        assert shell.match.group(1) == "44 120"
        shell.sendline("exit 0")
        shell.expect(pexpect.EOF)
    finally:
        shell.close()
    assert shell.exitstatus == 0


def test_exec_without_t_gives_stdout_stderr_apart_and_the_exit_code(
    served: Served, node: str
) -> None:
    """No PTY: stdout to stdout, stderr to stderr, no terminal (`-t` gives one), and the
    exit code; with -i, stdin is a pipe that ends where the CLI's does; both streams
    recorded."""
    env = served.files.cli_env
    script = "echo out-1; echo err-1 >&2; test -t 0 || echo no-tty; exit 7"
    done = run_cli(env, "node", "exec", node, "--", "sh", "-c", script)
    assert done.returncode == 7, done.stderr
    assert (done.stdout, done.stderr) == ("out-1\nno-tty\n", "err-1\n")
    [started, *_] = audit_rows(env, "session.start")
    cast = run_cli(env, "session", "play", started["target"], "--cast")
    played = "".join(json.loads(line)[2] for line in cast.stdout.splitlines()[1:])
    assert "out-1" in played and "err-1" in played, cast.stdout
    fed = subprocess.run(
        cli_command("node", "exec", node, "-i", "--", "sh", "-c", "tr a-z A-Z; echo end"),
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        input="piped in\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (fed.returncode, fed.stdout) == (0, "PIPED IN\nend\n"), fed.stderr


def test_a_viewer_may_not_open_a_session_nor_anyone_on_an_unknown_node(
    served: Served, node: str, tmp_path: Path
) -> None:
    viewer = operator_certs.issue(served.files, "vic", tmp_path / "vic", ADVERTISE, role="viewer")
    env = {"OZ0_CONTEXT": str(viewer.directory / CONTEXT_FILE)}
    refused = run_cli(env, "node", "exec", node, "--", "true")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: operator vic (viewer) may not open sessions on nodes"
    ), refused.stderr
    unknown = run_cli(served.files.cli_env, "node", "exec", "node-000000000000", "--", "true")
    assert unknown.returncode == 1
    assert unknown.stderr == "error: node node-000000000000 not found\n", unknown.stderr


def test_a_session_as_a_named_user_the_node_lists_for_admins_only(
    served: Served, node: str, tmp_path: Path
) -> None:
    """--user runs it as that account where the node lists it (--session-users), named in
    the grant and the audit; refused in one line when the node does not list it, and to an
    operator of the tenant (admins only)."""
    env = served.files.cli_env
    done = run_cli(env, "node", "exec", node, "--user", SESSION_USER, "--", "id", "-un")
    assert (done.returncode, done.stdout) == (0, f"{SESSION_USER}\n"), done.stderr
    [started, *_] = audit_rows(env, "session.start")
    assert started["details"]["user"] == SESSION_USER
    shown = run_cli(env, "session", "show", started["target"], "--json")
    assert json.loads(shown.stdout)["user"] == SESSION_USER, shown.stderr
    refused = run_cli(env, "node", "exec", node, "--user", NOT_LISTED, "--", "id", "-un")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"error: node {node} refused the session: this node does not allow sessions as "
        f"{NOT_LISTED} (oz0-node --session-users)\n"
    )
    bad = run_cli(env, "node", "exec", node, "--user", "a b", "--", "true")
    assert (bad.returncode, bad.stderr) == (1, "error: --user 'a b' is not an account's name\n")
    carol = operator_certs.issue(served.files, "carol", tmp_path / "c", ADVERTISE, role="operator")
    operator = {"OZ0_CONTEXT": str(carol.directory / CONTEXT_FILE)}
    refused = run_cli(operator, "node", "shell", node, "--user", SESSION_USER)
    assert refused.returncode == 1
    assert refused.stderr == (
        "error: operator carol (operator) may not open sessions as a named user\n"
    ), refused.stderr
    # Without --user the operator's session runs, as a UID of its own.
    own = run_cli(operator, "node", "exec", node, "--", "id", "-u")
    assert own.returncode == 0, own.stderr
    assert int(own.stdout) in range(DEFAULT_RANGE.first, DEFAULT_RANGE.last + 1)


def uid_processes(uid: int) -> list[int]:
    """The PIDs of UID's processes on this machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except FileNotFoundError:
                continue
    return found


def none_left(uid: int, within: float = 10.0) -> None:
    """No process of UID is left, WITHIN seconds from now at most."""
    deadline = time.monotonic() + within
    while uid_processes(uid):
        assert time.monotonic() < deadline, f"uid {uid} still runs {uid_processes(uid)}"
        time.sleep(0.1)


def test_a_session_runs_under_the_launcher_and_leaves_nothing_behind(
    served: Served, node: str, session_agent: Running
) -> None:
    """Its command's parent is a supervisor the agent's launcher forked, not the agent (no
    fork of the agent's threads); what it left running, even in a session of its own, is
    ended with it."""
    script = (
        'echo "uid-$(id -u) parent-$PPID"; tr "\\0" " " < /proc/$PPID/cmdline; echo;'
        " setsid sleep 300 </dev/null >/dev/null 2>&1 &"
    )
    done = run_cli(served.files.cli_env, "node", "exec", node, "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    first, cmdline = done.stdout.splitlines()
    uid, parent = (int(word.partition("-")[2]) for word in first.split())
    assert session_agent.agent.process is not None and parent != session_agent.agent.process.pid
    assert "from oz0_node.jobs.launcher import main" in cmdline, cmdline
    assert uid in range(DEFAULT_RANGE.first, DEFAULT_RANGE.last + 1)
    none_left(uid)


def test_a_session_ends_with_its_agent_and_an_offline_node_is_said_in_one_line(
    served: Served, node: str, session_agent: Running
) -> None:
    """The agent killed (-9): its sessions' CLIs get one line each, a session's processes
    are ended by its supervisor, its UID's too; the node offline is one line; a new agent
    ends what a session whose supervisor was killed too left, and serves sessions again."""
    env = served.files.cli_env
    script = "echo started-$(id -u)-$PPID; exec sleep 600"
    session, orphaned = started_session(env, node, script), started_session(env, node, script)
    uid = int(session.started.split("-")[1])
    orphaned_uid, orphaned_supervisor = map(int, orphaned.started.split("-")[1:])
    agent = session_agent.agent
    assert agent.process is not None
    agent.process.kill()
    os.kill(orphaned_supervisor, signal.SIGKILL)
    agent.process.wait(10)
    for each in (session, orphaned):
        err = ended_within(each, 10)
        assert err.startswith("error: the session ended: "), err
    none_left(uid)
    assert uid_processes(orphaned_uid), "no supervisor is left to end it"
    offline = run_cli(env, "node", "exec", node, "--", "true")
    assert (offline.returncode, offline.stderr) == (1, f"error: node {node} is not connected\n")
    session_agent.agent = AgentProcess.resuming(agent.data_dir, "--session-users", SESSION_USER)
    session_agent.agent.start()
    wait_connected(env, node)
    none_left(orphaned_uid)
    assert not list((agent.data_dir / "sessions").iterdir())
    again = run_cli(env, "node", "exec", node, "--", "echo", "back")
    assert (again.returncode, again.stdout) == (0, "back\n"), again.stderr


def test_a_block_ends_a_session_within_2_s(served: Served, node: str) -> None:
    env = served.files.cli_env
    session = started_session(env, node)
    try:
        blocked = run_cli(env, "node", "block", node, "--reason", "sessions test")
        assert blocked.returncode == 0, blocked.stderr
        err = ended_within(session, BLOCK_BOUND)
        assert "stream to this server ended" in err, err
        refused = run_cli(env, "node", "exec", node, "--", "true")
        assert (refused.returncode, refused.stderr) == (1, f"error: node {node} is not connected\n")
    finally:
        assert run_cli(env, "node", "unblock", node).returncode == 0
        wait_connected(env, node)


def test_the_web_ui_lists_sessions_and_replays_one_in_chromium(
    served: Served, node: str, browser: Any, tmp_path: Path
) -> None:
    env = served.files.cli_env
    done = run_cli(env, "node", "exec", node, "--", "sh", "-c", "printf 'web-%s\\n' replayed")
    assert done.returncode == 0, done.stderr
    [session] = json.loads(run_cli(env, "session", "list", "--limit", "1", "--json").stdout)
    console: list[str] = []
    page: Any = signed_in_watched(browser, ADVERTISE, served.files.ui_password, console)
    page.goto(f"https://{ADVERTISE}:8443/sessions")
    row = page.locator(f"tr[data-session='{session['id']}']")
    expect(row).to_contain_text("printf")
    checked_shot(page, shots(tmp_path), "sessions.png", console)
    click_to_load(page, row.get_by_role("link", name=session["id"]))
    screen = page.locator("#screen")
    expect(screen).to_contain_text("web-replayed")
    # Cleared, then played back at the recording's pace: the blank screen may last less
    # than a poll of Playwright's on a loaded machine, so the page itself notes it.
    page.evaluate(BLANK_WATCH)
    page.get_by_role("button", name="Replay").click()
    expect(screen).to_contain_text("web-replayed", timeout=10_000)
    assert page.evaluate("window.oz0TestBlanked") is True
    checked_shot(page, shots(tmp_path), "session.png", console)


# Notes (window.oz0TestBlanked) whether #screen was ever drawn blank from now on.
BLANK_WATCH = """() => {
  const screen = document.getElementById("screen");
  window.oz0TestBlanked = false;
  new MutationObserver(() => {
    if (screen.textContent.trim() === "") { window.oz0TestBlanked = true; }
  }).observe(screen, { childList: true, subtree: true, characterData: true });
}"""


class Session(subprocess.Popen[str]):
    started = ""  # the line it printed first


def started_session(
    env: dict[str, str], node: str, script: str = "echo started; exec sleep 600"
) -> Session:
    """`node exec NODE -- sh -c SCRIPT` (which prints a line beginning `started`, then
    sleeps), once it has printed it."""
    session = Session(
        cli_command("node", "exec", node, "--", "sh", "-c", script),
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert session.stdout is not None
    session.started = session.stdout.readline().strip()
    assert session.started.startswith("started"), session.stderr
    return session


def ended_within(session: subprocess.Popen[str], bound: float) -> str:
    """SESSION's stderr once it ended, BOUND seconds from now at most (it must fail)."""
    began = time.monotonic()
    try:
        _, err = session.communicate(timeout=30)
    finally:
        if session.poll() is None:
            session.kill()
            session.communicate()
    took = time.monotonic() - began
    assert session.returncode == 1, err
    assert took <= bound, f"the session ended {took:.2f} s after"
    return err


def test_a_session_ends_within_2_s_when_its_person_may_no_longer_open_it(
    served: Served, node: str, tmp_path: Path
) -> None:
    bob = operator_certs.issue(served.files, "bob", tmp_path / "bob", ADVERTISE, role="operator")
    session = started_session({"OZ0_CONTEXT": str(bob.directory / CONTEXT_FILE)}, node)
    operator_certs.set_role(served.files, "bob", "viewer")
    err = ended_within(session, BLOCK_BOUND)
    assert "may not open sessions on nodes any more" in err, err


def test_an_idle_session_ends_at_the_cluster_s_idle_timeout(served: Served, node: str) -> None:
    env = served.files.cli_env
    assert run_cli(env, "cluster", "set", "--session-idle-timeout", "2s").returncode == 0
    try:
        session = started_session(env, node)
        err = ended_within(session, 2 + 1.5)
        assert "error: the session ended: it was idle for 2 s" in err, err
    finally:
        assert run_cli(env, "cluster", "set", "--session-idle-timeout", "15m").returncode == 0


def test_ctrl_c_interrupts_a_command_on_its_terminal(served: Served, node: str) -> None:
    """No shell to open /dev/tty: the PTY is the command's controlling terminal all the
    same, so Ctrl-C reaches it (SIGINT: exit code 130)."""
    env = {**os.environ, **served.files.cli_env, "PYTHONPATH": str(REPO)}
    command = ["-m", "cli.main", "node", "exec", node, "-i", "-t", "--"]
    sleeper = pexpect.spawn(
        sys.executable,
        [*command, "sh", "-c", "echo go-$((6*7)); exec sleep 30"],
        env=env,
        timeout=30,
        encoding="utf-8",
    )
    try:
        sleeper.expect("go-42")
        began = time.monotonic()
        sleeper.sendintr()
        sleeper.expect(pexpect.EOF)
        assert time.monotonic() - began < 5
    finally:
        sleeper.close()
    assert sleeper.exitstatus == 130, sleeper.before
