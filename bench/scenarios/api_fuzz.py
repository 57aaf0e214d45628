"""The API fuzzed from its own description, the long pass (issue 45; the short one is
tests/test_api_fuzz.py).

    python -m bench.api_fuzz [--examples N] [--seed S]

The runner starts a fresh test cluster and one real server on 127.0.0.56. People of every
role are made (a cluster-wide admin, operator and viewer, and an admin of tenant acme);
then schemathesis makes N valid and N invalid requests of every operation of the
document the server serves at /api/v1/openapi.json, as each of them, and every answer is
held to fixtures/api_fuzz.py's rules (no 5xx, no stack trace, every refusal one line of
JSON, every answer as described, a refused request changing nothing). A seed makes a run
that can be repeated (none: Hypothesis' derandomized cases, the test's).

The document: the requests made, the answers by operation and status, how long the pass
took, and what broke a rule (the first example of each operation, role and rule).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.runner import Bench, Scenario, log
from fixtures import api_fuzz, scoped_people
from oz0_common.addresses import MANAGEMENT_PORT

ADDRESS = "127.0.0.56"


def measure(bench: Bench) -> None:
    args, files, out = bench.args, bench.files, bench.out
    people_dir = bench.root / "people"
    people = {
        "admin": scoped_people.make(files, people_dir, ADDRESS, "root", "admin", []),
        "operator": scoped_people.make(files, people_dir, ADDRESS, "oscar", "operator", []),
        "viewer": scoped_people.make(files, people_dir, ADDRESS, "vera", "viewer", []),
    }
    people["admin"].ok("POST", "/api/v1/tenants", {"name": "acme"})
    people["admin of acme"] = scoped_people.make(
        files, people_dir, ADDRESS, "ada", "admin", ["acme"]
    )
    document: dict[str, Any] = people["viewer"].ok("GET", "/api/v1/openapi.json")
    bench.phase[0] = "fuzzing"
    started = time.monotonic()
    findings = api_fuzz.fuzz(
        document, f"https://{ADDRESS}:{MANAGEMENT_PORT}", people,
        files.main_db, examples=args.examples, seed=args.seed,
    )  # fmt: skip
    out["seconds"] = round(time.monotonic() - started, 1)
    out["requests"] = findings.requests
    out["answers"] = {
        f"{operation} {status}": count
        for (operation, status), count in sorted(findings.statuses.items())
    }
    out["broken"] = [
        {"operation": op, "role": role, "rule": rule, "example": example}
        for (op, role, rule), example in sorted(findings.examples.items())
    ]
    log(f"{findings.requests} requests in {out['seconds']} s; {len(out['broken'])} broken")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--examples", type=int, default=100, help="cases per operation, role and mode"
    )
    parser.add_argument("--seed", type=int, default=None)


SCENARIO = Scenario(
    "api_fuzz",
    __doc__ or "",
    arguments,
    run_blocking=measure,
    servers=lambda _: (ADDRESS,),
)
