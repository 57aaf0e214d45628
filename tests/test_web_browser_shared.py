"""web_support's `browser`: the test files of one pytest process share one chromium, each
file's contexts are closed at its end, and a file between two browser files can still run
asyncio. Checked in a pytest of its own (a subprocess: what is checked happens between
files, at their setup and teardown) over three files, in order: one that leaves a context
open, one that runs `asyncio.run`, one that finds the first one's browser with no context.
And the browser opens no omnibox pages (web_support's NO_OMNIBOX_PAGES). No server, no
address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import Browser

from tests.web_support import NO_OMNIBOX_PAGES, browser

__all__ = ["browser"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    # What the files share: the browser each file was given, in the order they ran.
    "given.py": "browsers: list[object] = []\n",
    "test_a_leaves_a_context.py": """
from given import browsers
from playwright.sync_api import Browser

from tests.web_support import browser

__all__ = ["browser"]


def test_a_page_left_open(browser: Browser) -> None:
    browsers.append(browser)
    page = browser.new_context().new_page()
    page.set_content("<p>left open</p>")
    assert len(browser.contexts) == 1
""",
    "test_b_runs_asyncio.py": """
import asyncio


def test_asyncio_runs_between_browser_files() -> None:
    assert asyncio.run(asyncio.sleep(0, "ran")) == "ran"
""",
    "test_c_finds_it_closed.py": """
from given import browsers
from playwright.sync_api import Browser

from tests.web_support import browser

__all__ = ["browser"]


def test_the_same_browser_without_the_last_file_s_context(browser: Browser) -> None:
    assert browsers == [browser], "one chromium per process"
    assert browser.contexts == [], "the first file's context outlived it"
    browser.new_context().new_page().set_content("<p>another</p>")
""",
    "pytest.ini": "[pytest]\nfilterwarnings = error\n",
}


def test_files_share_one_browser_and_leave_no_context_to_the_next(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    # Plugins not loaded: none is needed, and each costs the inner pytest its start.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
         *sorted(n for n in FILES if n.startswith("test_"))],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 passed" in ran.stdout, ran.stdout


def test_a_window_opens_no_omnibox_pages(browser: Browser) -> None:
    page = browser.new_context().new_page()
    page.goto("chrome://version")
    given = page.locator("#command_line").inner_text().split()
    # One: web_support's took the place of Playwright's own. Two: Playwright passes others
    # than web_support's PLAYWRIGHT_DISABLES names, and the features it turns off are off
    # no longer; name them there.
    disabled = [a.split("=", 1)[1].split(",") for a in given if a.startswith("--disable-features=")]
    assert len(disabled) == 1, disabled
    assert set(NO_OMNIBOX_PAGES) <= set(disabled[0]), disabled
    targets = browser.new_browser_cdp_session().send("Target.getTargets")["targetInfos"]
    assert not [t["url"] for t in targets if "omnibox" in t["url"]], targets
