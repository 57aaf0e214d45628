"""A name with no web account is answered as a real name with a wrong password, at every
step (OWASP's authentication cheat sheet: the same status, body and time): through the
lockout per name and source and the lockout per source, against one real server on
127.0.0.77, from two source addresses (.77 and .79) whose histories mirror each other,
one using the real name where the other uses an unknown one. And a wrong password costs
the same time for either (lower quartiles within noise).
"""

from __future__ import annotations

import http.client
import re
import ssl
import statistics
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from fixtures.cluster import Served
from oz0 import ui_sessions as sessions

SERVER = "127.0.0.77"
ADVERTISE = SERVER  # the module's server (`served`, tests/conftest.py)
# The two sources sign-ins come from (a client binds its end of the connection there).
REAL, MIRROR = "127.0.0.77", "127.0.0.79"
ORIGIN = f"https://{SERVER}:8443"
KNOWN = "admin"
# Timing: pairs of tries (one of each name, in turn) and how far apart their lower
# quartiles may be on a loaded 2-core machine: a quarter of the slower one, or 15 ms,
# whichever is larger. The lower quartile, not the median: other work on the machine only
# ever adds time, in bursts that a median of a few dozen tries can still catch on one side
# (it did: 66 ms against 94), while the faster tries show what each answer costs, as an
# attacker repeating them would see. An unknown name checked against no hash is a whole
# scrypt (about 50 ms) faster.
TRIES = 31
RELATIVE_NOISE, ABSOLUTE_NOISE = 0.25, 0.015


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    body: str


class Browser:
    """Sign-ins from SOURCE over one kept connection, as a browser's form posts them."""

    def __init__(self, served: Served, source: str) -> None:
        # Trusting the web UI CA, as a browser is told to.
        url = served.files.url
        with psycopg.connect(url.for_database(url.names.main)) as conn:
            row = conn.execute("SELECT ui_ca_cert FROM cluster").fetchone()
        assert row is not None
        tls = ssl.create_default_context(cadata=row[0])
        self.https = http.client.HTTPSConnection(
            SERVER, 8443, context=tls, timeout=30, source_address=(source, 0)
        )

    def sign_in(self, name: str, password: str) -> Answer:
        form = urllib.parse.urlencode({"username": name, "password": password})
        headers = {
            "Origin": ORIGIN,
            "Accept": "text/html",
            "Content-Type": "application/x-www-form-urlencoded",
        }
        self.https.request("POST", "/sign-in", form, headers)
        answer = self.https.getresponse()
        body = answer.read().decode()
        # The page gives back the name typed: the only difference allowed.
        body = body.replace(f'value="{name}"', 'value="NAME"')
        return Answer(answer.status, answer.getheader("Retry-After"), body)

    def close(self) -> None:
        self.https.close()


@pytest.fixture
def browsers(served: Served) -> Iterator[tuple[Browser, Browser]]:
    """A browser at each source, with no failed sign-in counted anywhere."""
    forget_failures(served)
    real, mirror = Browser(served, REAL), Browser(served, MIRROR)
    yield real, mirror
    real.close()
    mirror.close()


def forget_failures(served: Served) -> None:
    url = served.files.url
    with psycopg.connect(url.for_database(url.names.main), autocommit=True) as conn:
        conn.execute("DELETE FROM ui_sign_in_failures")


# The names of one run, by slot: slot 1 until its lockout and once more, slot 2 the same,
# one try each of slots 3-12 (the source's 20th failure), then slot 13 (refused: the
# source's lockout, whatever the name) and slot 2 again.
FREE = sessions.FREE_FAILURES
STEPS = [1] * (FREE + 1) + [2] * (FREE + 1) + list(range(3, 13)) + [13, 2]


@pytest.mark.parametrize("known_slot", [1, 2, 7, 13])
def test_an_unknown_name_is_answered_as_a_known_one_through_both_lockouts(
    served: Served, browsers: tuple[Browser, Browser], known_slot: int
) -> None:
    assert sessions.FREE_FAILURES_PER_SOURCE == 2 * FREE + 10, "STEPS fill it exactly"
    real, mirror = browsers
    statuses = []
    for step, slot in enumerate(STEPS):
        # The real name at its slot from one source; unknown names everywhere else.
        name = KNOWN if slot == known_slot else f"nobody-{slot}"
        answer = real.sign_in(name, "a wrong password")
        mirrored = mirror.sign_in(f"no-one-{slot}", "a wrong password")
        assert answer == mirrored, (step, slot, name, answer.status, mirrored.status)
        statuses.append(answer.status)
    # Both lockouts were reached: each name's after FREE, and the source's after 20.
    wrong, locked = 401, 429
    assert statuses == (
        [wrong] * FREE + [locked] + [wrong] * FREE + [locked] + [wrong] * 10 + [locked] * 2
    )


def test_a_wrong_password_takes_as_long_for_an_unknown_name_as_for_a_known_one(
    served: Served, browsers: tuple[Browser, Browser]
) -> None:
    real, _ = browsers
    took: dict[str, list[float]] = {KNOWN: [], "nobody": []}
    for _ in range(TRIES):
        for name in took:
            forget_failures(served)  # never limited: each try checks a password
            began = time.perf_counter()
            answer = real.sign_in(name, "a wrong password")
            took[name].append(time.perf_counter() - began)
            assert answer.status == 401, answer.body[:300]
    known, unknown = (statistics.quantiles(took[name], n=4)[0] for name in took)
    allowed = max(RELATIVE_NOISE * max(known, unknown), ABSOLUTE_NOISE)
    medians = " / ".join(f"{statistics.median(took[name]) * 1000:.1f}" for name in took)
    shown = (
        f"known {known * 1000:.1f} ms, unknown {unknown * 1000:.1f} ms (lower quartiles;"
        f" medians {medians} ms)"
    )
    print(shown)
    assert abs(known - unknown) <= allowed, shown


def test_the_refusals_say_no_more_than_wrong_or_wait(
    served: Served, browsers: tuple[Browser, Browser]
) -> None:
    real, _ = browsers
    wrong = real.sign_in("nobody", "a wrong password")
    assert re.search(r"Wrong username or password\.", wrong.body)
    for _ in range(FREE):
        real.sign_in("nobody", "a wrong password")
    waiting = real.sign_in("nobody", "a wrong password")
    assert (waiting.status, waiting.retry_after) == (429, "30")
    assert "Too many failed sign-ins; try again in 30 seconds." in waiting.body
