"""People: `operator add` gives a one-time code, the person's `operator enroll` trades it
for a certificate of a key made on its machine (and a web account), and an admin's
`operator list / show / set / remove` change what it may do, on every server within two
seconds. One cluster of three real servers sharing one database (127.0.0.110-.112), the
real CLI, curl for the web UI and the real `temporal` CLI for Temporal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shlex
import stat
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from cli.client import ApiClient, ApiError
from fixtures.cli_runner import ok
from fixtures.cluster import REPO, ClusterFiles, cli_command, cluster_of
from fixtures.cluster_db import sql
from fixtures.enrolled_people import (
    CHANGE_BOUND,
    PASSWORD,
    add,
    client_at,
    code_of,
    enroll,
    enrolled_person,
    env_of,
    password_file,
    within_bound_on_every_server,
)
from fixtures.web_events import curl, sign_in_works
from oz0 import access, enrollment, operators, pki
from oz0 import cluster as cluster_mod
from tests.conftest import CliResult, CliRunner

pytestmark = pytest.mark.slow

A, B, C = "127.0.0.110", "127.0.0.111", "127.0.0.112"
SERVERS = (A, B, C)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFiles]:
    with cluster_of(tmp_path_factory.mktemp("people"), SERVERS) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def only_admin(files: ClusterFiles) -> None:
    """Each test starts with `server init`'s admin alone, and no refusals counted."""
    sql(files, "DELETE FROM operators WHERE name <> 'admin'")
    sql(files, "UPDATE operators SET role = 'admin', tenants = '{}' WHERE name = 'admin'")
    sql(files, "DELETE FROM ui_accounts WHERE username <> 'admin'")
    sql(files, "DELETE FROM operator_enrollments")
    sql(files, "DELETE FROM operator_enroll_failures")


@pytest.fixture
def admin(files: ClusterFiles) -> dict[str, str]:
    return files.cli_env


def first_line(result: CliResult) -> str:
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    return lines[0]


# --- enrollment ---------------------------------------------------------------------------


def test_an_enrollment_code_works_once_and_a_wrong_or_expired_one_is_refused_and_counted(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    added = add(cli, admin, "alice", "--role", "viewer")
    assert set(added) >= {"name", "role", "tenants", "expires_at", "enroll_command"}
    assert (added["name"], added["role"], added["tenants"]) == ("alice", "viewer", [])
    assert "code" not in added, "the code is in the command only"
    assert f"--server {A}:8443 --ca-hash {files.ca_hash}" in added["enroll_command"]
    assert code_of(added) not in str(sql(files, "SELECT * FROM operator_enrollments"))

    done = enroll(cli, added, tmp_path / "alice", "--no-web", "--json")
    assert done.code == 0, done.err
    answer = done.json()
    assert (answer["operator"], answer["role"], answer["web_sign_in"]) == ("alice", "viewer", False)
    where = tmp_path / "alice"
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    for name in ("context.json", "ca.crt", "operator.crt", "operator.key"):
        assert stat.S_IMODE((where / name).stat().st_mode) == 0o600, name
    assert ok(cli("node", "list", env=env_of(where))).code == 0, "the new certificate works"

    again = enroll(cli, added, tmp_path / "again", "--no-web")
    assert again.code == 1
    assert first_line(again).startswith("error: enrollment code already used")

    wrong = enroll(cli, added, tmp_path / "wrong", "--no-web", code="not-a-code")
    assert wrong.code == 1
    assert first_line(wrong).startswith("error: enrollment code refused")

    late = add(cli, admin, "bob", "--role", "operator", "--expires", "30m")
    sql(files, "UPDATE operator_enrollments SET expires_at = now() - interval '1 s'")
    expired = enroll(cli, late, tmp_path / "bob", "--no-web")
    assert expired.code == 1
    assert first_line(expired).startswith("error: enrollment code expired at")
    assert not (tmp_path / "bob").exists() and not (tmp_path / "wrong").exists()

    counted = sql(files, "SELECT source, count(*) FROM operator_enroll_failures GROUP BY 1")
    assert len(counted) == 1 and counted[0][1] == 3, counted
    # Past the limit even a good code is refused, with one line and 429.
    source = counted[0][0]
    for _ in range(enrollment.MAX_FAILURES_PER_SOURCE):
        sql(files, "INSERT INTO operator_enroll_failures (source) VALUES (%s)", source)
    fresh = add(cli, admin, "carol", "--role", "viewer")
    limited = enroll(cli, fresh, tmp_path / "carol", "--no-web")
    assert limited.code == 1
    assert first_line(limited) == (
        "error: too many refused enrollment codes from this address; "
        "try again in a quarter of an hour"
    )


def test_refused_codes_count_against_an_ipv6_source_by_its_64() -> None:
    assert enrollment.source_of(("2001:db8:1:2:aaaa::1", 5000)) == "2001:db8:1:2::/64"
    assert enrollment.source_of(("2001:db8:1:2:bbbb::7", 5000)) == "2001:db8:1:2::/64"
    assert enrollment.source_of(("::ffff:10.0.0.9", 5000)) == "10.0.0.9"
    assert enrollment.source_of(("10.0.0.9", 5000)) == "10.0.0.9"


def test_enroll_takes_its_secrets_only_from_private_files_or_the_environment_and_pins_the_ca(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    added = add(cli, admin, "alice", "--role", "viewer")
    words = shlex.split(added["enroll_command"])[2:]
    code_file = tmp_path / "code"
    code_file.write_text(code_of(added) + "\n")
    code_file.chmod(0o644)
    where = ("--operator-dir", str(tmp_path / "alice"), "--no-web")
    open_file = cli(*words, "--code-file", str(code_file), *where)
    assert open_file.code == 1
    assert "is open to group or others (mode 0644); run: chmod 600" in first_line(open_file)

    other_hash = "sha256:" + "0" * 64
    pinned = [*words[:-1], other_hash]
    mismatch = cli(*pinned, *where, env={"OZ0_ENROLL_CODE": code_of(added)})
    assert mismatch.code == 1
    assert first_line(mismatch).startswith(f"error: CA hash mismatch: {A}:8443 presented")
    assert sql(files, "SELECT count(*) FROM operator_enroll_failures") == [(0,)], (
        "the code never went to a server that did not show the pinned CA"
    )

    short = password_file(tmp_path, "short")
    refused = enroll(cli, added, tmp_path / "alice", "--web-password-file", str(short))
    assert refused.code == 1
    assert "The new password is too short" in first_line(refused)
    weak = password_file(tmp_path)
    weak.chmod(0o640)
    assert enroll(cli, added, tmp_path / "alice", "--web-password-file", str(weak)).code == 1

    code_file.chmod(0o600)
    weak.chmod(0o600)
    done = cli(*words, "--code-file", str(code_file), "--operator-dir", str(tmp_path / "alice"),
               "--web-password-file", str(weak))  # fmt: skip
    assert done.code == 0, "a refused password does not use the code up: " + done.err
    assert done.out.splitlines()[-1] == f"export OZ0_CONTEXT={tmp_path / 'alice' / 'context.json'}"
    assert sql(files, "SELECT username FROM ui_accounts WHERE username = 'alice'") == [("alice",)]
    assert sign_in_works(A, "alice", PASSWORD, tmp_path / "jar")


def on_a_terminal(args: list[str], env: dict[str, str], answers: list[str]) -> tuple[int, str]:
    """Run the CLI with ARGS on a terminal of its own (a pty, its controlling terminal, as
    getpass wants), typing each of ANSWERS after a prompt; its exit code and all it wrote."""
    master, slave = pty.openpty()

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        cli_command(*args), stdin=slave, stdout=slave, stderr=slave,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)}, preexec_fn=own_terminal,
    )  # fmt: skip
    os.close(slave)
    seen = b""

    def read(until: bytes | None) -> None:
        """Until a new prompt ends in UNTIL (getpass drops what was typed before its
        prompt), or the end."""
        nonlocal seen
        start = len(seen)
        deadline = time.monotonic() + 30
        while until is None or not seen[start:].rstrip().endswith(until):
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {until!r} from the command; it wrote {seen!r}")
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the command ended and closed the terminal
                return
            if not chunk:
                return
            seen += chunk

    try:
        for answer in answers:
            read(b":")
            os.write(master, answer.encode() + b"\n")
        read(None)
        return process.wait(30), seen.decode()
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()


def test_enroll_asks_the_web_password_twice_on_a_terminal(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    added = add(cli, admin, "alice", "--role", "viewer")
    args = [*shlex.split(added["enroll_command"])[2:], "--operator-dir", str(tmp_path / "a")]
    env = {"OZ0_ENROLL_CODE": code_of(added)}
    code, said = on_a_terminal(args, env, [PASSWORD, PASSWORD + "x"])
    assert code == 1 and "error: the passwords differ; run the command again" in said, said
    code, said = on_a_terminal(args, env, [PASSWORD, PASSWORD])
    assert code == 0, said
    assert "Web UI password" in said and PASSWORD not in said, "typed, not shown"
    assert sign_in_works(C, "alice", PASSWORD, tmp_path / "jar")


# --- what a role allows -------------------------------------------------------------------


def test_a_viewer_reads_and_is_refused_a_job_run_and_the_people_in_one_line(
    cli: CliRunner, admin: dict[str, str], tmp_path: Path
) -> None:
    alice = env_of(enrolled_person(cli, admin, tmp_path, "alice", "--role", "viewer"))
    assert ok(cli("node", "list", env=alice)).code == 0
    assert ok(cli("job", "list", env=alice)).code == 0
    run = cli("job", "run", "--", "true", env=alice)
    assert run.code != 0
    assert first_line(run) == "error: operator alice (viewer) may not run jobs"
    listed = cli("operator", "list", env=alice)
    assert first_line(listed) == "error: operator alice (viewer) may not list operators"
    removing = cli("operator", "remove", "admin", env=alice)
    assert first_line(removing) == "error: operator alice (viewer) may not remove operators"
    # Its own certificate is its own to renew; the role stays.
    ok(cli("operator", "renew", env=alice))
    assert first_line(cli("job", "run", "--", "true", env=alice)).endswith("may not run jobs")


def test_a_renewal_never_brings_back_an_operator_removed_meanwhile(files: ClusterFiles) -> None:
    # The API authorizes from a cache (a second at most): a renewal authorized just before
    # a removal must not re-create the operator, as a new cluster-wide admin at that.
    with psycopg.connect(files.main_db) as conn:
        cluster = cluster_mod.load(conn, pki.read_master_key(files.master_key))
        key = pki.new_private_key()
        ghost = access.person("operator", "ghost", "viewer", ["default"])
        with pytest.raises(operators.OperatorNotFound):
            operators.issue_certificate(
                conn, cluster.cluster_ca, "ghost", key.public_key(), actor=ghost,
                action="operator.renew", create=False,
            )  # fmt: skip
        conn.rollback()
    assert sql(files, "SELECT name FROM operators WHERE name = 'ghost'") == []


def test_list_and_show_give_role_tenants_certificate_last_use_and_web_sign_in(
    cli: CliRunner, admin: dict[str, str], tmp_path: Path
) -> None:
    alice = enrolled_person(cli, admin, tmp_path, "alice", "--role", "operator", web=True)
    ok(cli("node", "list", env=env_of(alice)))  # used once
    add(cli, admin, "bob", "--role", "viewer", "--tenant", "default")
    people = {p["name"]: p for p in ok(cli("operator", "list", "--json", env=admin)).json()}
    assert sorted(people) == ["admin", "alice", "bob"]
    shown = ok(cli("operator", "show", "alice", "--json", env=admin)).json()
    assert shown == people["alice"]
    assert set(shown) == {
        "name", "role", "tenants", "state", "created_at", "certificate_not_after",
        "last_used_at", "web_sign_in", "enroll_expires_at",
    }  # fmt: skip
    assert (shown["role"], shown["tenants"], shown["state"]) == ("operator", [], "enrolled")
    assert shown["certificate_not_after"] and shown["last_used_at"] and shown["web_sign_in"]
    bob = people["bob"]
    assert (bob["state"], bob["tenants"], bob["web_sign_in"]) == ("pending", ["default"], False)
    assert bob["enroll_expires_at"] and bob["certificate_not_after"] is None
    table = ok(cli("operator", "list", env=admin)).out
    assert "pending (code until" in table
    shown_text = ok(cli("operator", "show", "bob", env=admin)).out
    assert "tenants:" in shown_text and "default" in shown_text
    missing = cli("operator", "show", "nobody", env=admin)
    assert first_line(missing) == "error: operator nobody not found"
    again = cli("operator", "add", "alice", "--role", "viewer", env=admin)
    assert "operator alice exists already" in first_line(again)
    pending = cli("operator", "add", "bob", "--role", "viewer", env=admin)
    assert "has an open enrollment already" in first_line(pending)
    unknown = cli("operator", "add", "carol", "--role", "viewer", "--tenant", "nope", env=admin)
    assert first_line(unknown) == "error: tenant nope does not exist"
    too_long = cli("operator", "add", "carol", "--role", "viewer", "--expires", "49h", env=admin)
    assert "at most 48h" in first_line(too_long)
    # A pending person removed: its code is void.
    removed = ok(cli("operator", "remove", "bob", "--json", env=admin)).json()
    assert removed["was"] == "pending"
    # What people read.
    added = ok(cli("operator", "add", "dave", "--role", "viewer", env=admin)).out.splitlines()
    assert added[0].startswith("operator dave (viewer) added; the code below works once")
    assert added[-1].startswith("OZ0_ENROLL_CODE=") and " operator enroll --server " in added[-1]
    changed = ok(cli("operator", "set", "alice", "--tenant", "default", env=admin)).out
    assert changed == (
        "operator alice (operator of default): changed; every server acts on it within two "
        "seconds\n"
    )
    gone = ok(cli("operator", "remove", "alice", env=admin)).out
    assert gone == "operator alice (operator of default) removed: its certificate refused\n"


def test_an_admin_of_some_tenants_manages_only_the_people_of_its_tenants(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    if "acme" not in {t["name"] for t in ok(cli("tenant", "list", "--json", env=admin)).json()}:
        ok(cli("tenant", "create", "acme", env=admin))
    bob = env_of(
        enrolled_person(cli, admin, tmp_path, "bob", "--role", "admin", "--tenant", "acme")
    )
    wider = cli("operator", "add", "carol", "--role", "viewer", env=bob)
    assert first_line(wider) == (
        "error: operator bob (admin of acme) may not add operators of every tenant"
    )
    other = cli("operator", "add", "carol", "--role", "viewer", "--tenant", "default", env=bob)
    assert first_line(other) == (
        "error: operator bob (admin of acme) may not add operators in tenant default"
    )
    added = add(cli, bob, "carol", "--role", "operator", "--tenant", "acme")
    assert added["tenants"] == ["acme"]
    seen = [p["name"] for p in ok(cli("operator", "list", "--json", env=bob)).json()]
    assert seen == ["bob", "carol"], "not admin, a cluster-wide person"
    hidden = cli("operator", "show", "admin", env=bob)
    assert first_line(hidden) == "error: operator admin not found"
    assert first_line(cli("operator", "remove", "admin", env=bob)) == (
        "error: operator admin not found"
    )
    widen = cli("operator", "set", "bob", "--all-tenants", env=bob)
    assert first_line(widen) == (
        "error: operator bob (admin of acme) may not make operators of every tenant"
    )
    rows = sql(
        files, "SELECT actor_kind, actor, tenants FROM audit_log WHERE action = 'operator.add'"
        " AND target = 'operator:carol' ORDER BY id DESC LIMIT 1",
    )  # fmt: skip
    assert rows == [("operator", "bob", ["acme"])], "the row names the person and its tenants"


def test_the_last_cluster_wide_admin_may_not_be_removed_demoted_or_scoped(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    last = "error: operator admin is the last cluster-wide admin and may not be"
    assert first_line(cli("operator", "remove", "admin", env=admin)).startswith(f"{last} removed")
    demote = cli("operator", "set", "admin", "--role", "operator", env=admin)
    assert first_line(demote).startswith(f"{last} demoted or scoped")
    scope = cli("operator", "set", "admin", "--tenant", "default", env=admin)
    assert first_line(scope).startswith(f"{last} demoted or scoped")
    # Another cluster-wide admin, by `server operator issue` (a new name: a cluster-wide admin).
    issued = tmp_path / "root"
    ok(cli("server", "operator", "issue", "root", "--master-key-file", str(files.master_key),
           "--operator-dir", str(issued), "--advertise", A, env=admin))  # fmt: skip
    root = ok(cli("operator", "show", "root", "--json", env=admin)).json()
    assert (root["role"], root["tenants"]) == ("admin", [])
    ok(cli("operator", "set", "root", "--role", "viewer", "--tenant", "default", env=admin))
    # Re-issued, an existing operator keeps its role and tenants.
    ok(cli("server", "operator", "issue", "root", "--master-key-file", str(files.master_key),
           "--operator-dir", str(issued), env=admin))  # fmt: skip
    root = ok(cli("operator", "show", "root", "--json", env=admin)).json()
    assert (root["role"], root["tenants"]) == ("viewer", ["default"])


def test_two_admins_removing_each_other_at_once_leave_one(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    for round in range(3):
        root = enrolled_person(cli, admin, tmp_path / f"round-{round}", "root", "--role", "admin")
        callers = {"admin": client_at(files.context_dir, B), "root": client_at(root, C)}
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(callers[who].request, "DELETE", f"/api/v1/operators/{other}")
                for who, other in (("admin", "root"), ("root", "admin"))
            ]
            refusals = [str(e) for f in futures if (e := f.exception()) is not None]
        # The second is refused as the last admin, or as a caller removed already.
        assert len(refusals) == 1, refusals
        left = sql(files, "SELECT name FROM operators WHERE role = 'admin' AND tenants = '{}'")
        assert len(left) == 1, (left, refusals)
        if left == [("root",)]:  # admin back, for the next round and the next tests
            ok(cli("server", "operator", "issue", "admin", "--master-key-file",
                   str(files.master_key), "--operator-dir", str(files.context_dir),
                   env=admin))  # fmt: skip
        sql(files, "DELETE FROM operators WHERE name = 'root'")


# --- every server within two seconds ------------------------------------------------------


def api_refuses(client: ApiClient, path: str, refusal: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            client.get(path)
        except ApiError as e:
            return refusal in str(e)
        return False

    return check


def test_a_new_role_holds_on_every_server_within_two_seconds(
    cli: CliRunner, admin: dict[str, str], tmp_path: Path
) -> None:
    alice = enrolled_person(cli, admin, tmp_path, "alice", "--role", "viewer")
    clients = {s: client_at(alice, s) for s in SERVERS}
    output = "/api/v1/jobs/job-000000000000/output"
    for client in clients.values():  # each server holds her as a viewer
        assert api_refuses(client, output, "(viewer) may not read job output")()

    def reads_output(client: ApiClient) -> Callable[[], bool]:
        return lambda: not api_refuses(client, output, "may not read job output")()

    ok(cli("operator", "set", "alice", "--role", "operator", env=admin))
    took = within_bound_on_every_server({s: reads_output(c) for s, c in clients.items()})
    print(f"the new role held after {took}")
    assert max(took.values()) < CHANGE_BOUND, took


def web_session_gone(server: str, jar: Path) -> Callable[[], bool]:
    def check() -> bool:
        answer = curl("-b", str(jar), "-o", "/dev/null", "-w", "%{http_code}",
                      f"https://{server}:8443/overview")  # fmt: skip
        return answer.stdout != "200"

    return check


def temporal_workflows(server: str, where: Path) -> subprocess.CompletedProcess[str]:
    """The real `temporal` CLI, a read-only call, with the person's certificate."""
    temporal = str(Path(sys.executable).parent / "temporal")
    return subprocess.run(
        [temporal, "workflow", "list", "--namespace", "default", "--limit", "1",
         "--address", f"{server}:7233", "--tls-cert-path", str(where / "operator.crt"),
         "--tls-key-path", str(where / "operator.key"), "--tls-ca-path", str(where / "ca.crt"),
         "--command-timeout", "5s"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        env={**os.environ, "TEMPORAL_CLI_SHOW_STACKS": ""},
    )  # fmt: skip


def temporal_refuses(server: str, where: Path) -> Callable[[], bool]:
    return lambda: temporal_workflows(server, where).returncode != 0


def test_a_removed_person_is_refused_by_api_web_ui_and_temporal_on_every_server_within_two_seconds(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    carol = enrolled_person(cli, admin, tmp_path, "carol", "--role", "admin", web=True)
    clients = {s: client_at(carol, s) for s in SERVERS}
    jars = {s: tmp_path / f"jar-{s}" for s in SERVERS}
    for server in SERVERS:
        assert sign_in_works(server, "carol", PASSWORD, jars[server]), server
        assert not web_session_gone(server, jars[server])()
        listed = temporal_workflows(server, carol)
        assert listed.returncode == 0, listed.stderr
        clients[server].get("/api/v1/cluster")  # each server has her cached
    assert sql(files, "SELECT count(*) FROM ui_sessions WHERE username = 'carol'") == [(3,)]

    removed = ok(cli("operator", "remove", "carol", "--json", env=admin)).json()
    checks: dict[str, Callable[[], bool]] = {}
    for server in SERVERS:
        checks[f"api {server}"] = api_refuses(
            clients[server], "/api/v1/cluster", "operator carol is unknown"
        )
        checks[f"web {server}"] = web_session_gone(server, jars[server])
        checks[f"temporal {server}"] = temporal_refuses(server, carol)
    took = within_bound_on_every_server(checks)
    print(f"carol refused after {took}")
    assert max(took.values()) < CHANGE_BOUND, took
    assert (removed["was"], removed["web_account"], removed["sessions_ended"]) == (
        "enrolled", True, 3,
    )  # fmt: skip
    assert sql(files, "SELECT count(*) FROM ui_sessions WHERE username = 'carol'") == [(0,)]
    assert not sign_in_works(A, "carol", PASSWORD, tmp_path / "jar-again"), (
        "its web account is gone"
    )


# --- the audit log ------------------------------------------------------------------------


def test_every_change_is_audited_in_the_person_s_name_and_audit_list_finds_both_kinds(
    cli: CliRunner, files: ClusterFiles, admin: dict[str, str], tmp_path: Path
) -> None:
    first = sql(files, "SELECT max(id) FROM audit_log")[0][0]
    enrolled_person(
        cli, admin, tmp_path, "alice", "--role", "viewer", "--tenant", "default", web=True
    )
    assert sign_in_works(B, "alice", PASSWORD, tmp_path / "jar")
    ok(cli("operator", "set", "alice", "--role", "operator", env=admin))
    rows = sql(
        files, "SELECT actor_kind || ':' || actor, action, tenants FROM audit_log"
        " WHERE target = 'operator:alice' AND id > %s ORDER BY id", first,
    )  # fmt: skip
    assert rows == [
        ("operator:admin", "operator.add", ["default"]),
        ("operator:alice", "operator.enroll", ["default"]),
        ("operator:admin", "operator.set", ["default"]),
    ]
    found = ok(cli("audit", "list", "--actor", "alice", "--json", env=admin)).json()
    kinds = {(e["actor"]["kind"], e["action"]) for e in found}
    assert {("operator", "operator.enroll"), ("ui", "ui.login")} <= kinds, kinds
    ok(cli("operator", "remove", "alice", env=admin))
    removal = sql(
        files, "SELECT actor, tenants FROM audit_log WHERE action = 'operator.remove'"
        " AND id > %s", first,
    )  # fmt: skip
    assert removal == [("admin", ["default"])]
