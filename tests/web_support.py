"""What the web UI's browser tests share: Debian's chromium through Playwright (one
browser per pytest process; each test opens its own context, closed at the end of its
file at the latest), signing in, screenshots."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright import sync_api as playwright

from fixtures.cluster import ClusterFiles, cli_command
from fixtures.web_events import curl
from oz0 import passwords
from oz0.context import Context

CHROMIUM = Path("/usr/bin/chromium")

# Each context a test opens is a window of chromium's, and each window loads its address
# bar's popup: two pages of chromium's own (chrome://omnibox-popup.top-chrome/ and its AI
# mode one) in renderers of their own, which no test sees or uses. They took a third of
# chromium's CPU in the web tests' files (167 CPU-s of it, 110 without them, the files run
# in one process); without them the popup is chromium's native one.
NO_OMNIBOX_PAGES = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup")
# Chromium reads the last --disable-features it is given, not all of them: ours takes the
# place of Playwright's own, so it names Playwright's too (as Playwright 1.65 gives them).
# Playwright's is left out only if it is exactly this one; test_web_browser_shared checks
# that the browser is given one --disable-features.
PLAYWRIGHT_DISABLES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose", "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable", "LensOverlay", "MediaRouter", "PaintHolding",
    "ThirdPartyStoragePartitioning", "AvoidCorsURLLoaderRestartOnRedirect",
    "TcpPortRandomizationWin", "OptimizationHints", "NetworkTimeServiceQuerying", "AimEnabled",
    "PreconnectToSearch", "msForceBrowserSignIn", "msEdgeUpdateLaunchServicesPreferredVersion",
)  # fmt: skip

__all__ = [
    "CHROMIUM", "browser", "checked_shot", "click_to_load", "curl", "person", "shots",
    "sign_in", "signed_in", "signed_in_watched",
]  # fmt: skip


@dataclass
class _Chromium:
    """This pytest process's chromium and the Playwright driving it (each launch starts a
    Playwright driver, chromium and its GPU, network and zygote processes), shared by
    every test file that uses `browser`."""

    driver: playwright.Playwright
    # Playwright's sync API runs its own asyncio loop, and marks it as this thread's running
    # loop after each call. Left so, `asyncio.run` (and so the Temporal SDK's tests) and
    # another `sync_playwright()` (tests/test_ui_certificate.py) refuse to start in any test
    # file that runs later in this process: `browser` marks it only while a file runs.
    loop: asyncio.AbstractEventLoop
    launched: playwright.Browser

    def relaunched(self) -> playwright.Browser:
        """The browser, launched again if it is gone (a crash stays in its own file)."""
        if not self.launched.is_connected():
            self.launched = _launch(self.driver)
        return self.launched


def _launch(driver: playwright.Playwright) -> playwright.Browser:
    """Debian's chromium, without the omnibox's pages (`NO_OMNIBOX_PAGES`)."""
    return driver.chromium.launch(
        executable_path=str(CHROMIUM),
        ignore_default_args=["--disable-features=" + ",".join(PLAYWRIGHT_DISABLES)],
        args=["--disable-features=" + ",".join((*PLAYWRIGHT_DISABLES, *NO_OMNIBOX_PAGES))],
    )


_CHROMIUM = pytest.StashKey[_Chromium]()


def _started(config: pytest.Config) -> _Chromium:
    """This process's chromium, started by the first file that asks; stopped at the end
    of the run (the config's cleanup)."""
    if _CHROMIUM not in config.stash:
        driver = playwright.sync_playwright().start()
        try:
            launched = _launch(driver)
        except BaseException:
            driver.stop()
            raise
        config.stash[_CHROMIUM] = _Chromium(driver, asyncio.get_running_loop(), launched)
        asyncio._set_running_loop(None)

        def stop() -> None:
            chromium = config.stash[_CHROMIUM]
            asyncio._set_running_loop(chromium.loop)
            try:
                chromium.launched.close()
            finally:
                chromium.driver.stop()  # ends the loop, which unmarks it

        config.add_cleanup(stop)
    return config.stash[_CHROMIUM]


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[playwright.Browser]:
    """This process's one chromium (a fixture per file, not per session: a session fixture
    imported by each test file would be one per file). At the end of the file, the
    contexts its tests opened are closed, so that their pages do not outlive it."""
    running = asyncio._get_running_loop()
    assert running is None, f"an asyncio loop runs around a browser test file: {running}"
    chromium = _started(request.config)
    asyncio._set_running_loop(chromium.loop)
    try:
        launched = chromium.relaunched()
        before = list(launched.contexts)
        yield launched
        if launched.is_connected():
            for context in launched.contexts:
                if context not in before:
                    context.close()
    finally:
        asyncio._set_running_loop(None)


def shots(tmp_path: Path) -> Path:
    """Where screenshots go: `OZ0_SCREENSHOTS`, else the test's temporary directory."""
    where = Path(os.environ.get("OZ0_SCREENSHOTS", tmp_path / "screenshots"))
    where.mkdir(parents=True, exist_ok=True)
    return where


def sign_in(page: object, address: str, password: str, username: str = "admin") -> None:
    page.goto(f"https://{address}:8443/")  # type: ignore[attr-defined]
    page.get_by_label("Username").fill(username)  # type: ignore[attr-defined]
    page.get_by_label("Password").fill(password)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Sign in").click()  # type: ignore[attr-defined]


def signed_in(
    browser: object,
    address: str,
    password: str,
    *,
    username: str = "admin",
    console: list[str] | None = None,
    **options: Any,
) -> Any:
    """A page of a new context (OPTIONS), signed in as USERNAME at ADDRESS's web UI; each
    of its console messages appended to CONSOLE if given: a script or style the CSP
    refused says so there (`checked_shot`)."""
    context = browser.new_context(ignore_https_errors=True, **options)  # type: ignore[attr-defined]
    page = context.new_page()
    if console is not None:
        page.on("console", lambda m: console.append(m.text))
    sign_in(page, address, password, username)
    page.wait_for_url(f"https://{address}:8443/overview")
    return page


def signed_in_watched(
    browser: object, address: str, password: str, console: list[str], **options: Any
) -> object:
    """`signed_in` as the UI's admin, its console messages appended to CONSOLE."""
    return signed_in(browser, address, password, console=console, **options)


def checked_shot(page: object, where: Path, name: str, console: list[str]) -> None:
    """A screenshot of PAGE, once it is checked to hold no inline script or style and the
    browser to have refused nothing under the CSP (CONSOLE: `signed_in_watched`'s)."""
    html = page.content()  # type: ignore[attr-defined]
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), name
    assert not re.search(r"<[^>]*\s(style|on[a-z]+)=", html), name
    assert not [m for m in console if "Content Security Policy" in m], console
    page.screenshot(path=str(where / name), full_page=True)  # type: ignore[attr-defined]


def click_to_load(page: object, target: object) -> None:
    """Click TARGET (a link or a form's button) and return once the page it leads to has
    loaded. Playwright's click returns when the navigation has begun, when `page.url` may
    already be the new one while the old document (or none) is still what a count or an
    `evaluate_all` reads: those do not wait the way a locator's assertions do."""
    with page.expect_navigation(wait_until="load"):  # type: ignore[attr-defined]
        target.click()  # type: ignore[attr-defined]


def person(
    files: ClusterFiles,
    root: Path,
    name: str,
    role: str,
    tenants: Sequence[str] = (),
    password: str | None = None,
) -> str:
    """Operator NAME with ROLE in TENANTS (none: every tenant) and a web account of its
    name, made as a test makes a person before `operator add` exists: `server operator
    issue` with the master key (its context in ROOT/NAME), then its role and tenants, and
    a web account with PASSWORD (default: a new one). Its web password."""
    advertise = Context.load(files.context_path).servers[0].rsplit(":", 1)[0]
    issued = subprocess.run(
        cli_command("server", "operator", "issue", name, "--master-key-file",
                    str(files.master_key), "--operator-dir", str(root / name),
                    "--advertise", advertise),
        env={**os.environ, "OZ0_DB": files.url.conninfo}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    password = password or f"{name}-password-{secrets.token_hex(4)}"
    with psycopg.connect(files.main_db, autocommit=True) as c:
        c.execute(
            "UPDATE operators SET role = %s, tenants = %s WHERE name = %s",
            (role, list(tenants), name),
        )
        c.execute(
            "INSERT INTO ui_accounts (username, password_hash) VALUES (%s, %s)",
            (name, passwords.hash_password(password)),
        )
    return password
