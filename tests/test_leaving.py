"""A person's power ends when they leave, and shrinks when they are demoted or re-scoped
(oz0/leaving.py): a cluster of two real servers sharing one database (127.0.0.74-.75), a
real agent, real Temporal, the real CLI.

Removing a person pauses their schedule (its runs start nothing from then on), revokes their
join token at every server's edge and cancels the enrollment they made, all within two
seconds, audited, and `operator remove` says what it ended; re-scoping and demoting end
only what the person may no longer do; `schedule set ID --owner NAME` (an admin's) resumes
a schedule; a schedule whose owner was removed or demoted behind the product's back never
starts a job (each run checks); and a token that never expires or takes any number of
nodes is an admin's to make, in the API and on the web UI's form.

The person's certificate, web sessions and live streams ending are tested where they were
built: tests/test_people.py (`test_a_removed_person_is_refused_by_api_web_ui_and_temporal_...`)
and tests/test_web_session_ends.py (`test_a_live_stream_ends_within_about_2_s_of_its_session`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives import serialization

from cli.client import ApiClient, ApiError
from fixtures import edge_client, web_events
from fixtures.agent import AgentProcess, stop_all
from fixtures.cli_runner import ok
from fixtures.cluster import ClusterFiles, cluster_of
from fixtures.cluster_db import sql
from fixtures.enrolled_people import (
    CHANGE_BOUND,
    PASSWORD,
    add,
    client_at,
    code_of,
    enrolled_person,
    env_of,
    within_bound_on_every_server,
)
from fixtures.job_calls import jobs_of
from fixtures.polling import wait_until
from fixtures.web_events import curl
from oz0 import pki
from oz0.context import Context
from tests.conftest import CliResult, CliRunner, create_token

pytestmark = pytest.mark.slow

A, B = "127.0.0.74", "127.0.0.75"
SERVERS = (A, B)
# The shortest interval a schedule may have: runs come every second.
EVERY = "1s"
# Never due while a test runs.
NEVER = "0 0 1 1 *"
# Generous for a loaded 2-core machine.
RUN_BOUND = 30.0
LABEL = "role=leaving"


@dataclass(frozen=True)
class Cluster:
    files: ClusterFiles
    node: str

    @property
    def admin(self) -> dict[str, str]:
        return self.files.cli_env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("leaving")
    with cluster_of(root, SERVERS) as files:
        api = ApiClient(Context.load(files.context_path))
        # Runs every second (EVERY), below a tenant's default shortest interval.
        api.request("PATCH", "/api/v1/tenants/default", {"min_schedule_interval": 1})
        made = api.post(
            "/api/v1/tokens", {"tenant": "default", "ttl": "1h", "max_uses": 1, "labels": {}}
        )
        agent = AgentProcess.joining(
            root / "node", [f"{A}:7443"], files.ca_hash, token=made["token"],
            labels={"role": "leaving"}, max_jobs=8,
        ).start()  # fmt: skip
        try:
            status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
            yield Cluster(files, str(status["node_id"]))
        finally:
            stop_all([agent])


def one_line(result: CliResult) -> str:
    assert result.code != 0, result.out
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    return lines[0]


def schedule(cli: CliRunner, env: dict[str, str], *args: str) -> str:
    made = ok(cli("schedule", "create", "--json", *args, env=env))
    return str(made.json()["id"])


def every_second(cli: CliRunner, env: dict[str, str]) -> str:
    """A schedule of ENV's person running `true` on the module's node every second."""
    return schedule(cli, env, "--every", EVERY, "--selector", LABEL, "--", "true")


def token(cli: CliRunner, env: dict[str, str], *args: str) -> tuple[str, str]:
    """A join token of ENV's person: its ID and the string a node presents."""
    made = ok(cli("token", "create", "--json", *args, env=env)).json()
    return str(made["id"]), str(made["token"])


def shown(server: str, where: Path, schedule_id: str) -> dict[str, Any]:
    found: dict[str, Any] = client_at(where, server).get(f"/api/v1/schedules/{schedule_id}")
    return found


def jobs_after(
    cli: CliRunner, env: dict[str, str], schedule_id: str, at: dt.datetime
) -> list[dict[str, Any]]:
    return [
        j for j in jobs_of(cli, env, schedule_id) if dt.datetime.fromisoformat(j["created_at"]) > at
    ]


def audited_at(files: ClusterFiles, action: str, target: str) -> dt.datetime:
    """When the last ACTION to TARGET was audited: in the transaction that did it."""
    [(at,)] = sql(
        files, "SELECT at FROM audit_log WHERE action = %s AND target = %s ORDER BY id DESC"
        " LIMIT 1", action, target,
    )  # fmt: skip
    return at  # type: ignore[no-any-return]


def with_it(files: ClusterFiles, action: str, target: str, what: str) -> list[tuple[Any, ...]]:
    """WHAT (columns) of the audit rows written in the transaction of the last ACTION to
    TARGET, in order."""
    return sql(
        files, f"SELECT {what} FROM audit_log WHERE xmin::text = (SELECT xmin::text FROM"
        " audit_log WHERE action = %s AND target = %s ORDER BY id DESC LIMIT 1) ORDER BY id",
        action, target,
    )  # fmt: skip


def web_token(server: str, name: str, jar: Path, *, ttl: str, max_uses: str) -> tuple[str, str]:
    """Person NAME signed in on SERVER's web UI (its cookie in JAR) posts the Create token
    form for tenant default: the answer's status and page."""
    assert web_events.sign_in_works(server, name, PASSWORD, jar)
    base = f"https://{server}:8443"
    page = curl("-b", str(jar), f"{base}/tokens/new").stdout
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page[:300]
    answer = curl(
        "-b", str(jar), "-H", f"Origin: {base}", "-w", "\n%{http_code}",
        "--data-urlencode", f"csrf={found.group(1)}", "--data-urlencode", "tenant=default",
        "--data-urlencode", f"ttl={ttl}", "--data-urlencode", f"max_uses={max_uses}",
        f"{base}/tokens",
    )  # fmt: skip
    body, _, status = answer.stdout.rpartition("\n")
    return status, body


def join_refused(edge: str, ca_pem: bytes, secret: str) -> Callable[[], bool]:
    """Whether a node joining at EDGE with the token SECRET is refused as revoked."""

    def check() -> bool:
        keys = edge_client.NodeKeys.new()
        keys.ca_pem = ca_pem
        answer = trio.run(lambda: edge_client.join(edge, keys, token=secret, hostname="late"))
        return answer.get("type") == "error" and "revoked" in str(answer.get("message"))

    return check


def enrolled_refused(server: str, code: str, says: str) -> Callable[[], bool]:
    """Whether SERVER refuses the enrollment CODE (with a good certificate request), saying
    SAYS."""
    csr = pki.make_csr(pki.new_private_key(), "bob").public_bytes(serialization.Encoding.PEM)
    body = json.dumps({"code": code, "csr": csr.decode()})

    def check() -> bool:
        answer = curl(
            "-H", "Content-Type: application/json", "--data", body,
            f"https://{server}:8443/api/v1/operator/enroll",
        )  # fmt: skip
        return says in answer.stdout

    return check


def settled(server: str, where: Path, schedule_id: str) -> None:
    """Wait until SERVER's API shows the schedule paused in Temporal with none of its runs
    running: a run that was in flight has made its job (or was refused one) by then, and
    no run starts after. Watching for a while would only show none started meanwhile."""

    def check() -> bool:
        temporal = shown(server, where, schedule_id)["temporal"] or {}
        return temporal.get("paused") is True and temporal.get("running") == 0

    wait_until(check, RUN_BOUND, f"{schedule_id} paused, none of its runs running")


def schedule_paused(server: str, where: Path, schedule_id: str, reason: str) -> Callable[[], bool]:
    """Whether SERVER's API shows the schedule paused for REASON, in its row and Temporal."""

    def check() -> bool:
        found = shown(server, where, schedule_id)
        temporal = found["temporal"] or {}
        return (
            found["paused"] is True
            and found["paused_reason"] == reason
            and temporal.get("paused") is True
            and temporal.get("note") == f"paused: {reason}"
        )

    return check


def api_refuses(where: Path, server: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            client_at(where, server).get("/api/v1/cluster")
        except ApiError as e:
            return "is unknown" in str(e)
        return False

    return check


def ca_pem(files: ClusterFiles) -> bytes:
    return (files.context_dir / "ca.crt").read_bytes()


def test_removing_a_person_pauses_their_schedule_revokes_their_token_and_cancels_their_enrollment_within_two_seconds(  # noqa: E501
    cli: CliRunner, cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files, admin = cluster.files, cluster.admin
    alice_dir = enrolled_person(cli, admin, tmp_path, "alice", "--role", "admin", web=True)
    alice = env_of(alice_dir)
    running = every_second(cli, alice)
    token_id, secret = token(cli, alice, "--tenant", "default", "--ttl", "1h", "--max-uses", "5")
    # One made on the web UI too: in the name of her web account (ui:alice).
    status, page = web_token(A, "alice", tmp_path / "alice-jar", ttl="1h", max_uses="1")
    assert status == "200", page[-500:]
    on_web = sorted(set(re.findall(r"tok-[0-9a-f]{12}", page)))
    assert len(on_web) == 1, on_web
    bob = code_of(add(cli, alice, "bob", "--role", "admin"))
    wait_until(
        lambda: len(jobs_of(cli, admin, running)) >= 2, RUN_BOUND, "two runs in alice's name"
    )
    assert {j["created_by"] for j in jobs_of(cli, admin, running)} == {"operator:alice"}

    began = time.monotonic()
    removed = ok(cli("operator", "remove", "alice", "--json", env=admin)).json()
    returned = time.monotonic() - began
    reason = "its creator alice was removed"
    checks: dict[str, Callable[[], bool]] = {}
    for server in SERVERS:
        checks[f"schedule {server}"] = schedule_paused(server, files.context_dir, running, reason)
        checks[f"token {server}"] = join_refused(f"{server}:7443", ca_pem(files), secret)
        checks[f"enrollment {server}"] = enrolled_refused(
            server, bob, "enrollment code cancelled: alice, who made it, was removed"
        )
        checks[f"api {server}"] = api_refuses(alice_dir, server)
    took = within_bound_on_every_server(checks)
    # From before the command: its own time counts too.
    with capsys.disabled():  # the `cli` fixture reads what is printed otherwise
        print(f"\n`operator remove` took {returned:.3f} s; then each held after {took}")
    assert returned + max(took.values()) < CHANGE_BOUND, (returned, took)

    assert removed["schedules_paused"] == [running]
    assert removed["tokens_revoked"] == sorted([token_id, *on_web])
    assert removed["enrollments_cancelled"] == ["bob"]
    assert removed["schedules_not_paused_in_temporal"] == []
    assert removed["ended_elsewhere"] == 0

    # Its runs start nothing from the commit on: none made after it, none for a while.
    at = audited_at(files, "operator.remove", "operator:alice")
    settled(A, files.context_dir, running)
    assert jobs_after(cli, admin, running, at) == [], "a run started a job after alice left"
    assert "bob" not in {p["name"] for p in ok(cli("operator", "list", "--json", env=admin)).json()}

    # One row for each thing ended, by the admin who removed her, saying why.
    rows = with_it(files, "operator.remove", "operator:alice",
                   "actor_kind || ':' || actor, action, target, details, tenants")  # fmt: skip
    because = {"because": "operator.remove", "person": "alice"}
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("operator:admin", "schedule.pause", f"schedule:{running}"),
        *[("operator:admin", "token.revoke", f"token:{t}") for t in sorted([token_id, *on_web])],
        ("operator:admin", "operator.enrollment.cancel", "operator:bob"),
        ("operator:admin", "operator.remove", "operator:alice"),
    ]
    by_action = {r[1]: (r[3], r[4]) for r in rows}
    assert by_action["operator.remove"][0]["schedules_paused"] == 1
    assert by_action["operator.remove"][0]["tokens_revoked"] == 2
    assert by_action["operator.remove"][0]["enrollments_cancelled"] == 1
    assert by_action["schedule.pause"] == ({"tenant": "default", "reason": reason, **because},
                                           ["default"])  # fmt: skip
    assert by_action["token.revoke"][0]["reason"] == reason
    assert by_action["operator.enrollment.cancel"][0]["reason"] == "alice, who made it, was removed"

    # Paused until an admin takes it over: nobody unpauses or triggers it meanwhile.
    held = f"error: schedule {running} is paused: {reason}; an admin takes it over first"
    assert one_line(cli("schedule", "unpause", running, env=admin)).startswith(held)
    assert one_line(cli("schedule", "trigger", running, env=admin)).startswith(held)
    listed = ok(cli("schedule", "list", env=admin)).out
    assert f"paused: {reason}" in listed, listed
    # The web UI's Schedules page says so, and offers neither Run now nor Unpause for it.
    jar = tmp_path / "admin-jar"
    web_events.signed_in(B, files.ui_password, jar)
    page = curl("-b", str(jar), f"https://{B}:8443/schedules").stdout
    assert f"{reason}: an admin takes it over (schedule set {running} --owner NAME)" in page
    assert f"/schedules/{running}/unpause" not in page
    assert f"/schedules/{running}/trigger" not in page

    # Taken over: an admin only, for a person who may run it; then it runs in their name.
    olga = env_of(enrolled_person(cli, admin, tmp_path, "olga", "--role", "operator"))
    assert one_line(cli("schedule", "set", running, "--owner", "olga", env=olga)) == (
        "error: operator olga (operator) may not change schedules' owners"
    )
    refused = f"cannot own schedule {running}: a schedule's owner must be an enrolled operator"
    assert refused in one_line(cli("schedule", "set", running, "--owner", "alice", env=admin))
    assert refused in one_line(cli("schedule", "set", running, "--owner", "bob", env=admin))
    taken = ok(cli("schedule", "set", running, "--owner", "olga", env=admin)).out
    assert taken == (f"schedule {running}: owner operator:olga (was operator:alice); resumed\n"), (
        taken
    )
    resumed = audited_at(files, "schedule.owner", f"schedule:{running}")
    wait_until(lambda: jobs_after(cli, admin, running, resumed), RUN_BOUND, "a run in olga's name")
    assert {j["created_by"] for j in jobs_after(cli, admin, running, resumed)} == {"operator:olga"}
    now = shown(A, files.context_dir, running)
    assert (now["owner"], now["paused"], now["paused_reason"]) == ("operator:olga", False, None)
    assert now["created_by"] == "operator:alice"
    ok(cli("schedule", "delete", running, env=admin))


def test_re_scoping_and_demoting_a_person_end_only_what_they_may_no_longer_do(
    cli: CliRunner, cluster: Cluster, tmp_path: Path
) -> None:
    files, admin = cluster.files, cluster.admin
    if "acme" not in {t["name"] for t in ok(cli("tenant", "list", "--json", env=admin)).json()}:
        ok(cli("tenant", "create", "acme", env=admin))
    carol = env_of(
        enrolled_person(cli, admin, tmp_path, "carol", "--role", "admin", "--tenant", "default",
               "--tenant", "acme")
    )  # fmt: skip
    in_acme = schedule(cli, carol, "--cron", NEVER, "--tenant", "acme", "--", "true")
    running = every_second(cli, carol)
    acme_token, _ = token(cli, carol, "--tenant", "acme")
    forever, _ = token(cli, carol, "--tenant", "default", "--ttl", "0")
    plain, _ = token(cli, carol, "--tenant", "default")
    add(cli, carol, "dave", "--role", "operator", "--tenant", "acme")
    add(cli, carol, "erin", "--role", "viewer", "--tenant", "default")

    # Re-scoped to default: what was acme's ends, the rest stays.
    scoped = ok(cli("operator", "set", "carol", "--tenant", "default", "--json", env=admin)).json()
    assert (scoped["role"], scoped["tenants"]) == ("admin", ["default"])
    assert scoped["schedules_paused"] == [in_acme]
    assert scoped["tokens_revoked"] == [acme_token]
    assert scoped["enrollments_cancelled"] == ["dave"]
    # Paused in Temporal by the server that re-scoped her (a cron never due: no run did it).
    lost = "its creator carol may no longer run jobs in tenant acme"
    assert schedule_paused(A, files.context_dir, in_acme, lost)()
    assert shown(B, files.context_dir, running)["paused"] is False

    # Demoted to operator: what only an admin makes ends (a token for ever, an enrollment).
    demoted = ok(cli("operator", "set", "carol", "--role", "operator", env=admin)).out
    assert demoted == (
        "operator carol (operator of default): changed; every server acts on it within two"
        " seconds\n"
        f"revoked 1 join token: {forever}\n"
        "cancelled 1 enrollment it made: erin\n"
    ), demoted
    states = {t["id"]: t["revoked"] for t in ok(cli("token", "list", "--json", env=admin)).json()}
    assert (states[forever], states[plain], states[acme_token]) == (True, False, True)
    wait_until(lambda: len(jobs_of(cli, admin, running)) >= 1, RUN_BOUND, "a run as an operator")

    # Demoted to viewer: its schedule pauses and its last token goes.
    viewer = ok(cli("operator", "set", "carol", "--role", "viewer", "--json", env=admin)).json()
    assert viewer["schedules_paused"] == [running]
    assert viewer["tokens_revoked"] == [plain]
    assert viewer["enrollments_cancelled"] == []
    at = audited_at(files, "operator.set", "operator:carol")
    reason = "its creator carol may no longer run jobs (now a viewer)"
    for server in SERVERS:
        assert schedule_paused(server, files.context_dir, running, reason)()
    settled(A, files.context_dir, running)
    assert jobs_after(cli, admin, running, at) == [], "a run started a job after carol's demotion"
    rows = with_it(files, "operator.set", "operator:carol",
                   "action, details->>'because', details->>'reason'")  # fmt: skip
    assert rows[:-1] == [
        ("schedule.pause", "operator.set", reason),
        ("token.revoke", "operator.set", "its creator carol may no longer create join tokens"
                                        " in tenant default"),
    ]  # fmt: skip

    # A viewer cannot take it back; an admin gives it to itself, and it runs again.
    refused = one_line(cli("schedule", "set", running, "--owner", "carol", env=admin))
    assert "cannot own schedule" in refused
    done = ok(cli("schedule", "set", running, "--owner", "admin", "--json", env=admin)).json()
    assert (done["owner"], done["previous_owner"], done["resumed"]) == (
        "operator:admin", "operator:carol", True,
    )  # fmt: skip
    wait_until(lambda: jobs_after(cli, admin, running, at), RUN_BOUND, "a run in admin's name")
    # The acme one too, to an admin of acme.
    other = ok(cli("schedule", "set", in_acme, "--owner", "admin", "--json", env=admin)).json()
    assert other["resumed"] is True
    for schedule_id in (running, in_acme):
        ok(cli("schedule", "delete", schedule_id, env=admin))


def test_a_run_checks_its_owner_and_starts_nothing_for_one_removed_or_demoted_behind_its_back(
    cli: CliRunner, cluster: Cluster, tmp_path: Path
) -> None:
    """A person removed or demoted without the product's cascade (a server of the previous
    release, an edit of the table): the next run of their schedule finds it, starts no job,
    and pauses the schedule with the reason, audited as done by the schedule itself."""
    files, admin = cluster.files, cluster.admin
    frank = env_of(enrolled_person(cli, admin, tmp_path, "frank", "--role", "operator"))
    gina = env_of(enrolled_person(cli, admin, tmp_path, "gina", "--role", "operator"))
    franks, ginas = every_second(cli, frank), every_second(cli, gina)
    for one in (franks, ginas):
        wait_until(functools.partial(jobs_of, cli, admin, one), RUN_BOUND, f"{one}'s first run")

    sql(files, "DELETE FROM operators WHERE name = 'frank'")
    sql(files, "UPDATE operators SET role = 'viewer' WHERE name = 'gina'")
    [(changed,)] = sql(files, "SELECT now()")
    reasons = {
        franks: "its creator frank was removed",
        ginas: "its creator gina may no longer run jobs (now a viewer)",
    }
    for one, reason in reasons.items():
        wait_until(
            schedule_paused(A, files.context_dir, one, reason),
            RUN_BOUND,
            f"{one} paused by its run",
        )
    for one, reason in reasons.items():
        settled(A, files.context_dir, one)
        assert jobs_after(cli, admin, one, changed) == [], f"{one} ran after its owner went"
        rows = sql(
            files, "SELECT actor_kind, actor, details FROM audit_log WHERE action ="
            " 'schedule.pause' AND target = %s", f"schedule:{one}",
        )  # fmt: skip
        assert rows == [("schedule", one, {"tenant": "default", "reason": reason,
                                           "found_by": "its run"})]  # fmt: skip
        ok(cli("schedule", "delete", one, env=admin))


def test_a_token_that_never_expires_or_takes_any_number_of_nodes_is_an_admin_s(
    cli: CliRunner, cluster: Cluster, tmp_path: Path
) -> None:
    admin = cluster.admin
    hank_dir = enrolled_person(
        cli, admin, tmp_path, "hank", "--role", "operator", "--tenant", "default", web=True
    )
    hank = env_of(hank_dir)
    refusal = (
        "error: operator hank (operator of default) may not create join tokens that never"
        " expire (ttl 0) or have unlimited uses (max uses 0): only an admin may; give a ttl"
        " and a number of uses"
    )
    for lasting in (("--ttl", "0"), ("--max-uses", "0"), ("--ttl", "0", "--max-uses", "0")):
        assert one_line(cli("token", "create", "--tenant", "default", *lasting, env=hank)) == (
            refusal
        ), lasting
    try:
        client_at(hank_dir, B).post("/api/v1/tokens", {"tenant": "default", "max_uses": 0})
        raise AssertionError("the API made hank a token of unlimited uses")
    except ApiError as e:
        assert "403" in str(e) or "only an admin may" in str(e), e
    create_token(cli, hank, "--ttl", "2h", "--max-uses", "3")  # a bounded one is his to make
    create_token(cli, admin, "--ttl", "0", "--max-uses", "0")

    # The web UI's form: the same refusal, on the form, nothing made.
    before = len(ok(cli("token", "list", "--json", env=admin)).json())
    status, body = web_token(A, "hank", tmp_path / "jar", ttl="0", max_uses="1")
    assert status == "403", body[-500:]
    assert "only an admin may" in body
    assert len(ok(cli("token", "list", "--json", env=admin)).json()) == before
