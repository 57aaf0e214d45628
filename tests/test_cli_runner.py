"""The `cli` fixture's environment (fixtures/cli_runner.py's SharedEnviron): CLI runs that
overlap in threads leave os.environ as they found it, whichever ends first."""

from __future__ import annotations

import os

import pytest

from fixtures.cli_runner import SharedEnviron

NAME = "OZ0_TEST_SHARED_ENVIRON"


def test_overlapping_runs_restore_what_was_there_whichever_ends_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.setenv("OZ0_TEST_KEPT", "before")
    environ = SharedEnviron()
    wanted = {NAME: "set", "OZ0_TEST_KEPT": None}
    first = environ.applied(wanted)
    second = environ.applied(wanted)
    first.__enter__()
    second.__enter__()
    assert os.environ.get(NAME) == "set" and "OZ0_TEST_KEPT" not in os.environ
    first.__exit__(None, None, None)
    assert os.environ.get(NAME) == "set", "the second run still runs with it"
    second.__exit__(None, None, None)
    assert NAME not in os.environ, "nothing left behind"
    assert os.environ.get("OZ0_TEST_KEPT") == "before", "what was there is back"


def test_overlapping_runs_must_ask_for_the_same_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    environ = SharedEnviron()
    with environ.applied({NAME: "a"}):
        with (
            pytest.raises(AssertionError, match="different environments"),
            environ.applied({NAME: "b"}),
        ):
            pass
        assert os.environ.get(NAME) == "a"
    assert NAME not in os.environ
