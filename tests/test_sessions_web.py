"""Sessions in the web UI, in Chromium, on a real server and agent (127.0.0.29): a session's
page shows an admin what its terminal showed, a grid of its size (a carriage return
overwrites, an erase clears, a cursor move moves, a colour colours, the cursor shows),
with JavaScript or without, and plays it back; a viewer sees only that it happened.
Last, the server is killed (SIGKILL) during a live session and started again: the
session, live on the Sessions page before, is ended in the records by then (once, with
its audit row) and listed among the recent, its recording intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import REPO, Served, ServerProcess, cli_command, end_all, run_cli
from tests.web_support import browser, checked_shot, click_to_load, person, shots
from tests.web_support import signed_in_watched as signed_in

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sessions given UIDs)"),
]

__all__ = ["browser"]  # the fixture, used by name
ADVERTISE = "127.0.0.29"
UI = f"https://{ADVERTISE}:8443"
# What a terminal shows of this, line by line: "hello", erased once the cursor is back on
# its line; "abc", its first letter overwritten after a carriage return; "world" where
# "hello" was; "end", in red, where the cursor was moved, row 4, column 5; the cursor
# after it. A second apart, so that
# a replay shows each for a while; nothing in the first half second, so that it begins
# blank.
PRINTS = (
    "sleep 0.5; printf 'hello\\r\\n'; sleep 1; printf 'abc\\rX\\r\\n'; sleep 1;"
    " printf '\\033[1;1H\\033[2Kworld\\033[4;5H\\033[31mend\\033[0m'"
)
# The recording's length at 1 x, and at 16 x with room for a loaded machine.
LENGTH = 2.5
FAST = 2.0
SHOWN = ["world", "Xbc", "", "    end"]
# A killed server's sessions are ended within the up window (5 s) and a sweep (2 s) of
# its last heartbeat, by the server started again here; generous, as end-to-end bounds are
# (a loaded machine has lagged past 15 s).
ENDED_BOUND = 30.0


@pytest.fixture(scope="module")
def node(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    made = run_cli(served.files.cli_env, "token", "create", "--tenant", "default", "--json")
    assert made.returncode == 0, made.stderr
    agent = AgentProcess.joining(
        tmp_path_factory.mktemp("agent") / "node", [f"{ADVERTISE}:7443"],
        served.files.ca_hash, token=json.loads(made.stdout)["token"],
    ).start()  # fmt: skip
    try:
        status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
        yield str(status["node_id"])
    finally:
        stop_all([agent])


def grid(page: Any) -> list[str]:
    text: str = page.locator("#screen").text_content()
    return text.split("\n")


def test_a_session_s_page_shows_what_its_terminal_showed_and_plays_it_back(
    served: Served, node: str, browser: Any, tmp_path: Path
) -> None:
    env = served.files.cli_env
    done = run_cli(env, "node", "exec", node, "--", "sh", "-c", PRINTS)
    assert done.returncode == 0, done.stderr
    [session] = json.loads(run_cli(env, "session", "list", "--limit", "1", "--json").stdout)
    cols, rows = session["width"], session["height"]
    url = f"{UI}/sessions/{session['id']}"
    console: list[str] = []
    page: Any = signed_in(browser, ADVERTISE, served.files.ui_password, console)
    page.goto(url)
    screen = page.locator("#screen")
    expect(screen).to_contain_text("world")
    # The screen it left, a grid of its size: not the text written, escapes and all.
    shown = grid(page)
    assert [line.rstrip() for line in shown[:4]] == SHOWN
    assert len(shown) == rows and {len(line) for line in shown} == {cols}
    assert "hello" not in "".join(shown)
    expect(screen.locator("span.fg-red")).to_have_text("end")
    expect(screen.locator("span.cursor")).to_have_count(1)
    assert (
        page.evaluate("getComputedStyle(document.querySelector('#screen .fg-red')).color")
        == "rgb(205, 49, 49)"
    )
    checked_shot(page, shots(tmp_path), "session-last-screen.png", console)

    # Played back: blank first, then each step at its recorded time, "hello" before it
    # was erased.
    replay = page.get_by_role("button", name="Replay")
    pause = page.get_by_role("button", name="Pause")
    replay.click()
    expect(screen).to_have_text("")
    expect(screen).to_contain_text("hello")
    expect(screen).to_contain_text("world")
    expect(screen).not_to_contain_text("hello")
    expect(pause).to_be_disabled()  # played to its end
    assert grid(page) == shown
    expect(screen.locator("span.fg-red")).to_have_text("end")
    # (Not checked again: Playwright's screenshot leaves an empty style attribute behind.)
    page.screenshot(path=str(shots(tmp_path) / "session-replayed.png"), full_page=True)

    # Paused (before its first output), and played on.
    replay.click()
    pause.click()
    play = page.get_by_role("button", name="Play", exact=True)
    expect(play).to_be_enabled()
    play.click()
    expect(screen).to_contain_text("world", timeout=LENGTH * 1000 + 5000)
    expect(pause).to_be_disabled()
    # At 16 times its pace, over in much less than its length.
    page.get_by_label("Speed").select_option("16")
    replay.click()
    expect(pause).to_be_disabled(timeout=FAST * 1000)
    assert grid(page) == shown

    # The frames come in pages; one past the last is not found.
    first = page.request.get(f"{url}/frames.json?page=0")
    assert first.ok
    frames = first.json()
    assert (frames["cols"], frames["rows"], frames["next"]) == (cols, rows, None)
    assert frames["frames"][0]["t"] == 0 and len(frames["frames"]) >= 4
    assert page.request.get(f"{url}/frames.json?page=1").status == 404
    page.context.close()

    # Without JavaScript: the screen it left, and no controls that would do nothing.
    still = browser.new_context(ignore_https_errors=True, java_script_enabled=False)
    quiet = still.new_page()
    quiet.goto(f"{UI}/")
    quiet.get_by_label("Username").fill("admin")
    quiet.get_by_label("Password").fill(served.files.ui_password)
    quiet.get_by_role("button", name="Sign in").click()
    quiet.wait_for_url(f"{UI}/overview")
    quiet.goto(url)
    assert [line.rstrip() for line in grid(quiet)[:4]] == SHOWN
    expect(quiet.get_by_role("button", name="Replay")).to_be_hidden()
    still.close()

    # A viewer sees that it happened, not what it showed.
    password = person(served.files, tmp_path, "vera", "viewer")
    viewing = browser.new_context(ignore_https_errors=True)
    viewer = viewing.new_page()
    viewer.goto(f"{UI}/")
    viewer.get_by_label("Username").fill("vera")
    viewer.get_by_label("Password").fill(password)
    viewer.get_by_role("button", name="Sign in").click()
    viewer.wait_for_url(f"{UI}/overview")
    viewer.goto(url)
    expect(viewer.get_by_text("Only an admin of tenant default")).to_be_visible()
    expect(viewer.locator("#screen")).to_have_count(0)
    assert viewer.request.get(f"{url}/frames.json").status == 403
    viewing.close()


def test_a_killed_server_s_live_session_is_ended_when_it_starts_again(
    served: Served, node: str, browser: Any, tmp_path: Path
) -> None:
    """Last in this file: it kills the module's server (and starts it again)."""
    env = served.files.cli_env
    session = subprocess.Popen(
        cli_command("node", "exec", node, "--", "sh", "-c", "echo started; exec sleep 600"),
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert session.stdout is not None
        assert session.stdout.readline().strip() == "started", session.stderr
        [live] = json.loads(run_cli(env, "session", "list", "--live", "--json").stdout)
        console: list[str] = []
        page: Any = signed_in(browser, ADVERTISE, served.files.ui_password, console)
        page.goto(f"{UI}/sessions")
        live_table = page.locator("section[aria-labelledby='live-sessions']")
        expect(live_table.locator(f"tr[data-session='{live['id']}']")).to_contain_text("sleep")
        checked_shot(page, shots(tmp_path), "sessions-live.png", console)
        served.server.stop(signal.SIGKILL)
    finally:
        session.kill()
        session.communicate()
    # The same server again (a process of its own: the fixture's is spent).
    again = ServerProcess.for_cluster(served.files, ADVERTISE, workdir=tmp_path / "again")
    try:
        again.start()
        ended_by_the_restart(served, live["id"], page, console, tmp_path)
    finally:
        end_all([again])


def ended_by_the_restart(
    served: Served, session_id: str, page: Any, console: list[str], tmp_path: Path
) -> None:
    env = served.files.cli_env
    began = time.monotonic()
    while True:
        row = json.loads(run_cli(env, "session", "show", session_id, "--json").stdout)
        if row["ended_at"] is not None or time.monotonic() - began > ENDED_BOUND:
            break
        time.sleep(0.3)
    took = time.monotonic() - began
    assert row["ended_at"] is not None, f"not ended {took:.1f} s after its server started"
    assert (row["live"], row["why"]) == (False, "its server stopped")
    listed = run_cli(env, "audit", "list", "--action", "session.end", "--json")
    [end] = [e for e in json.loads(listed.stdout) if e["target"] == session_id]
    assert end["actor"]["kind"] == "server"
    assert end["details"]["output_bytes"] == row["output_bytes"] > 0

    # The Sessions page: none live, this one among the recent, ended so; its page plays.
    page.goto(f"{UI}/sessions")
    live_table = page.locator("section[aria-labelledby='live-sessions']")
    expect(live_table).to_contain_text("No session is open now.")
    recent = page.locator("section[aria-labelledby='recent-sessions']")
    ended = recent.locator(f"tr[data-session='{session_id}']")
    expect(ended).to_contain_text("its server stopped")
    checked_shot(page, shots(tmp_path), "sessions-ended.png", console)
    click_to_load(page, ended.get_by_role("link", name=session_id))
    expect(page.locator("#screen")).to_contain_text("started")
    print(f"ended in the records {took:.1f} s after its server started again")
