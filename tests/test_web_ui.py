"""The web UI in a real browser: Debian's chromium driven by Playwright, against a real
server on 127.0.0.194 (and .195 for a second server sharing the sessions).

Screenshots of every page go to the test's temporary directory (`OZ0_SCREENSHOTS` names
another), to be looked at, not committed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright import sync_api as playwright

from fixtures.cluster import ClusterFiles, cluster_of
from fixtures.web_events import curl
from oz0 import ui_sessions as sessions
from oz0.web.headers import CONTENT_SECURITY_POLICY
from tests.web_support import browser, shots, sign_in

__all__ = ["browser"]  # the fixture, used by name

SERVER, SECOND = "127.0.0.194", "127.0.0.195"


@pytest.fixture(scope="module")
def cluster_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFiles]:
    """One cluster and its two servers for the file (each test's own would cost a cluster
    and a server start apiece)."""
    with cluster_of(tmp_path_factory.mktemp("web-ui"), (SERVER, SECOND)) as files:
        yield files


@pytest.fixture(autouse=True)
def no_sessions_or_failures(cluster_files: ClusterFiles) -> None:
    """Each test starts signed out everywhere, with no failed sign-ins counted."""
    main = cluster_files.main_db
    with psycopg.connect(main, autocommit=True) as conn:
        conn.execute("DELETE FROM ui_sessions")
        conn.execute("DELETE FROM ui_sign_in_failures")


def landed(page: Any, files: ClusterFiles) -> str:
    """Where a sign-in that did not reach the overview landed, and why: the page's title
    and alert (a wrong password, the limit, the database away) and the sign-ins the server
    refused, with the username it was given (a key lost on the way shows there)."""
    alert = page.locator("[role=alert]")
    said = alert.first.inner_text() if alert.count() else ""
    with psycopg.connect(files.main_db) as conn:
        refused = conn.execute(
            "SELECT target FROM audit_log WHERE action = 'ui.login.failed' ORDER BY id"
        ).fetchall()
    return f"landed on {page.url}: {page.title()!r} {said!r}; refused: {refused}"


@pytest.mark.slow
def test_sign_in_sessions_on_every_server_and_sign_out(
    cluster_files: ClusterFiles, browser: object, tmp_path: Path
) -> None:
    context = browser.new_context(ignore_https_errors=True)  # type: ignore[attr-defined]
    page = context.new_page()
    where = shots(tmp_path)

    sign_in(page, SERVER, "not the password")
    assert page.get_by_role("alert").inner_text() == "Wrong username or password."
    page.screenshot(path=str(where / "sign-in-refused.png"), full_page=True)

    # With the keyboard alone: the username field has the focus, Tab, Enter. The page
    # gives it the focus (autofocus) at its first rendering, which may come after its load
    # event: keys pressed before then go elsewhere, so wait for the focus first.
    page.goto(f"https://{SERVER}:8443/")
    playwright.expect(page.get_by_label("Username")).to_be_focused()
    page.keyboard.type("admin")
    page.keyboard.press("Tab")
    page.keyboard.type(cluster_files.ui_password)
    page.keyboard.press("Enter")
    page.wait_for_url(lambda url: not url.endswith(":8443/"))
    assert page.url == f"https://{SERVER}:8443/overview", landed(page, cluster_files)
    assert page.get_by_role("heading", name="Overview").is_visible()
    page.keyboard.press("Tab")  # the first stop skips the navigation
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.screenshot(path=str(where / "overview.png"), full_page=True)
    [cookie] = context.cookies()
    assert cookie["name"] == sessions.COOKIE
    assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"]) == (True, True, "Strict")

    # The session is a row every server reads: the other server knows it.
    other = context.new_page()
    other.context.add_cookies([{**cookie, "domain": SECOND}])
    other.goto(f"https://{SECOND}:8443/overview")
    assert other.url == f"https://{SECOND}:8443/overview"
    assert other.get_by_text("admin", exact=True).is_visible()

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"https://{SERVER}:8443/")
    other.goto(f"https://{SECOND}:8443/overview")  # signed out everywhere
    assert other.url == f"https://{SECOND}:8443/"


@pytest.mark.slow
def test_headers_csrf_cross_origin_and_the_rate_limit(
    cluster_files: ClusterFiles, tmp_path: Path
) -> None:
    base = f"https://{SERVER}:8443"
    head = curl("-D", "-", "-o", "/dev/null", f"{base}/").stdout.lower()
    assert f"content-security-policy: {CONTENT_SECURITY_POLICY}".lower() in head
    assert "unsafe-inline" not in head and "unsafe-eval" not in head
    assert "frame-ancestors 'none'" in head and "x-content-type-options: nosniff" in head
    assert "strict-transport-security: max-age=" in head and "cache-control: no-store" in head
    page = curl(f"{base}/").stdout
    assert "<script" not in page and " style=" not in page  # nothing inline

    # The CA to trust is served, and its fingerprint on the sign-in page is what openssl
    # computes from it.
    ca = tmp_path / "ca.pem"
    assert curl("-o", str(ca), "-w", "%{http_code}", f"{base}/ca.pem").stdout == "200"
    fingerprint = subprocess.run(
        ["openssl", "x509", "-in", str(ca), "-noout", "-fingerprint", "-sha256"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split("=", 1)[1]  # fmt: skip
    assert fingerprint in page
    # A browser asking for a page that is not there gets a page; the CLI's clients JSON.
    missing = curl("-H", "Accept: text/html,*/*", "-w", "\n%{http_code}", f"{base}/no-such")
    assert missing.stdout.endswith("\n404") and "<h1>Not Found</h1>" in missing.stdout
    assert curl(f"{base}/no-such").stdout.startswith('{"error":"404 Not Found')

    # A post from another site, and one without the session's token, are refused.
    cross = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "Origin: https://evil.example",
                 "-d", "username=admin&password=x", f"{base}/sign-in")  # fmt: skip
    assert cross.stdout == "403"
    # Signed in (a cookie jar), but posting without the session's CSRF token.
    jar = str(tmp_path / "cookies")
    signed_in = curl("-c", jar, "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Origin: {base}",
                     "-d", f"username=admin&password={cluster_files.ui_password}",
                     f"{base}/sign-in")  # fmt: skip
    assert signed_in.stdout == "303"
    no_token = curl("-b", jar, "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Origin: {base}",
                    "-d", "csrf=not-it", f"{base}/sign-out")  # fmt: skip
    assert no_token.stdout == "403"
    still = curl("-b", jar, "-o", "/dev/null", "-w", "%{http_code}", f"{base}/overview")
    assert still.stdout == "200"  # the refused post ended nothing

    codes = [
        curl("-o", "/dev/null", "-w", "%{http_code}", "-H", f"Origin: {base}",
             "-d", "username=admin&password=wrong", f"{base}/sign-in").stdout
        for _ in range(sessions.FREE_FAILURES + 1)
    ]  # fmt: skip
    assert codes == ["401"] * sessions.FREE_FAILURES + ["429"]
    # Even the right password waits now (from here: the limit is per account and source),
    # and the answer says for how long.
    password = cluster_files.ui_password
    right = curl("-D", "-", "-o", "/dev/null", "-H", f"Origin: {base}",
                 "-d", f"username=admin&password={password}", f"{base}/sign-in")  # fmt: skip
    status, *headers = right.stdout.lower().splitlines()
    assert " 429" in status
    first = int(sessions.FIRST_DELAY.total_seconds())
    [wait] = [int(h.split(":", 1)[1]) for h in headers if h.startswith("retry-after:")]
    assert first - 5 <= wait <= first
