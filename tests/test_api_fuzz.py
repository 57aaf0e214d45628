"""The API fuzzed from its own description (issue 45), a short pass: schemathesis makes
valid and invalid requests of every operation of the document a real server on 127.0.0.56
serves, as people of every role (and of one tenant), and no answer breaks the rules of
fixtures/api_fuzz.py (no 5xx, no stack trace, every error one line, every answer as
described, no change made by a refused request). The long pass: bench/api_fuzz.py."""

from __future__ import annotations

from typing import Any

import pytest

from fixtures import api_fuzz, scoped_people
from fixtures.cluster import Served
from fixtures.scoped_people import Person

ADDRESS = "127.0.0.56"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
# Cases per operation, role and mode: the pass takes under a minute.
EXAMPLES = 3


@pytest.fixture(scope="module")
def people(served: Served, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Person]:
    files = served.files
    root = tmp_path_factory.mktemp("people")
    admin = scoped_people.make(files, root, ADDRESS, "root", "admin", [])
    admin.ok("POST", "/api/v1/tenants", {"name": "acme"})
    return {
        "admin": admin,
        "operator": scoped_people.make(files, root, ADDRESS, "oscar", "operator", []),
        "viewer": scoped_people.make(files, root, ADDRESS, "vera", "viewer", []),
        "admin of acme": scoped_people.make(files, root, ADDRESS, "ada", "admin", ["acme"]),
    }


def test_no_request_breaks_the_rules(served: Served, people: dict[str, Person]) -> None:
    document: dict[str, Any] = people["viewer"].ok("GET", "/api/v1/openapi.json")
    files = served.files
    findings = api_fuzz.fuzz(
        document, f"https://{ADDRESS}:8443", people,
        files.main_db, examples=EXAMPLES,
    )  # fmt: skip
    assert findings.requests > 0
    assert not findings.examples, f"{len(findings.examples)} broken:\n{findings.report()}"
