"""What the web UI's browser tests share: Debian's chromium through Playwright (one
browser per test file; each test opens its own context), signing in, screenshots."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright import sync_api as playwright

from fixtures.web_events import curl

CHROMIUM = Path("/usr/bin/chromium")

__all__ = ["CHROMIUM", "browser", "curl", "shots", "sign_in"]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


def shots(tmp_path: Path) -> Path:
    """Where screenshots go: `OZ0_SCREENSHOTS`, else the test's temporary directory."""
    where = Path(os.environ.get("OZ0_SCREENSHOTS", tmp_path / "screenshots"))
    where.mkdir(parents=True, exist_ok=True)
    return where


def sign_in(page: object, address: str, password: str) -> None:
    page.goto(f"https://{address}:8443/")  # type: ignore[attr-defined]
    page.get_by_label("Username").fill("admin")  # type: ignore[attr-defined]
    page.get_by_label("Password").fill(password)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Sign in").click()  # type: ignore[attr-defined]
