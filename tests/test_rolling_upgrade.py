"""A rolling upgrade (docs/run-a-cluster.md, "Upgrade a cluster"; 127.0.0.232 and .233): a
server of the previous release keeps serving beside one of this release that migrated the
database under it, and both serve nodes and jobs.

The previous release is built honestly: the files of the commit before the newest migration
came in (`git archive`, on the first-parent line), run with this virtualenv and the same
Temporal host binary, `PYTHONPATH` pointing at them. Its Python code and its migrations are
that release's; what it shares with this one is what a machine upgraded in place shares:
the installed libraries and the Temporal host (a release that changed the Temporal host
would bring its own, which is not what this test is about).

The previous release may not have the rule of oz0/store/migrations.py (the first release
with it is paired with one without it): that server writes no schema in its membership row,
checks nothing beyond its own start, and so only this release's side protects the pair. The
test checks that side on the real database: the old server is live, counted as older than
any migration, and a contract migration would wait for it while the expand ones were
applied.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cli.client import ApiClient
from fixtures.agent import AgentProcess
from fixtures.cluster import REPO, ClusterFiles, ServerProcess, cli_command, kill_all
from fixtures.polling import wait_until
from fixtures.postgres import fresh_database_url
from oz0 import membership
from oz0.context import Context
from oz0.jobs import inputs
from oz0.store import migrations
from oz0.temporal.host import HOST_ENV, host_binary
from tests.conftest import CliRunner, create_token

OLD, NEW = "127.0.0.232", "127.0.0.233"
MIGRATIONS = "oz0/store/migrations"
# Generous for a loaded 2-core machine.
JOB_BOUND = 40.0


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"not a git checkout with its history (git {args[0]}: {done.stderr.strip()})")
    return done.stdout


def previous_release() -> tuple[str, int]:
    """The newest commit on HEAD's first-parent line whose migrations are the first ones of
    this tree's, fewer of them, and how many it has: the commit just before the newest
    migration came in, or before a branch that numbered them otherwise was merged."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the previous release is built from this history")
    ours = sorted(p.name for p in (REPO / MIGRATIONS).glob("*.sql"))
    newer = "HEAD"
    for commit in _git("log", "--first-parent", "--format=%H", "HEAD", "--", MIGRATIONS).split():
        names = [
            Path(n).name
            for n in _git("ls-tree", "--name-only", commit, f"{MIGRATIONS}/").split()
            if n.endswith(".sql")
        ]
        if names and len(names) < len(ours) and names == ours[: len(names)]:
            # The newest commit with these migrations: the one before the next change (HEAD
            # when the newest migration is not committed yet).
            last = "HEAD" if newer == "HEAD" else f"{newer}^1"
            return _git("rev-parse", last).strip(), len(names)
        newer = commit
    pytest.skip("no commit in this history has an earlier set of this tree's migrations")


def build_previous(commit: str, into: Path) -> Path:
    tree = into / "previous"
    tree.mkdir()
    archive = into / "previous.tar"
    _git(
        "archive",
        "--format=tar",
        "-o",
        str(archive),
        commit,
        "cli",
        "oz0",
        "oz0_common",
        "oz0_node",
    )
    # tar(1): tarfile's extraction filter came in 3.11.4, and the suite runs on Debian 12's
    # 3.11.2 (noxfile.suite_python).
    subprocess.run(["tar", "-x", "-f", str(archive), "-C", str(tree)], check=True, timeout=60)
    return tree


def old_env(tree: Path, config_home: Path, url: str) -> dict[str, str]:
    """The previous release's processes: its code first on the path (before this
    virtualenv's editable install of ours), this Temporal host."""
    return dict(
        os.environ,
        PYTHONPATH=str(tree),
        OZ0_DB=url,
        XDG_CONFIG_HOME=str(config_home),
        **{HOST_ENV: str(host_binary())},
    )


def pinned(files: ClusterFiles, address: str) -> ApiClient:
    """An API client that asks the server at ADDRESS only."""
    context = Context.load(files.context_path)
    one = dataclasses.replace(context, servers=(f"{address}:8443",), learned=())
    return ApiClient(one, learn_servers=False)


def run_job(client: ApiClient, node: str, text: str) -> dict[str, Any]:
    job: dict[str, Any] = client.post(
        "/api/v1/jobs", {"tenant": "default", "command": ["echo", text], "node": node}
    )
    return wait_ended(client, job)


def wait_ended(client: ApiClient, job: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_BOUND
    while job["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, f"job did not end in {JOB_BOUND} s: {job}"
        time.sleep(0.2)
        job = client.get(f"/api/v1/jobs/{job['id']}")
    return job


def attempts_streamed(main: str, job_id: str) -> list[bool]:
    """Whether each attempt of JOB_ID went over its node's stream (else an activity)."""
    with psycopg.connect(main) as conn:
        rows = conn.execute(
            "SELECT streamed FROM job_attempts WHERE job_id = %s ORDER BY number", (job_id,)
        ).fetchall()
    return [bool(r[0]) for r in rows]


def live_schemas(main: str) -> list[int | None]:
    with psycopg.connect(main) as conn:
        return membership.live_schemas(conn)


def takes_stream(main: str, node: str) -> bool:
    with psycopg.connect(main) as conn:
        row = conn.execute("SELECT attempts_by_stream FROM nodes WHERE id = %s", (node,)).fetchone()
    return bool(row and row[0])


def why(job: dict[str, Any], servers: list[ServerProcess]) -> str:
    """What a failed job's assertion shows: the job and the end of each server's log."""
    return "\n".join([json.dumps(job), *(s.own_log()[-4000:] for s in servers)])


def test_a_server_of_the_previous_release_serves_nodes_and_jobs_beside_one_that_migrated(
    cli: CliRunner, tmp_path: Path
) -> None:
    commit, old_schema = previous_release()
    tree = build_previous(commit, tmp_path)
    started: list[ServerProcess] = []
    agents: list[AgentProcess] = []
    with fresh_database_url() as url:
        config_home = tmp_path / "config"
        env = old_env(tree, config_home, url.conninfo)
        # The cluster is the previous release's: its `server init` applies its migrations.
        made = subprocess.run(
            cli_command(
                "server", "init", "--cluster-name", "test", "--history-shards", "4",
                "--master-key-out", str(tmp_path / "master.key"), "--advertise", OLD, "--json",
            ),
            env=env, cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        files = ClusterFiles(
            url,
            "test",
            tmp_path / "master.key",
            config_home,
            json.loads(made.stdout)["ca_hash"],
            "",
        )
        main = url.for_database(url.names.main)
        with psycopg.connect(main) as conn:
            assert migrations.database_version(conn) == old_schema
        try:
            old = ServerProcess.for_cluster(files, OLD, workdir=tmp_path / "old")
            old.env.update(env)
            started.append(old.start())
            new = ServerProcess.for_cluster(files, NEW, workdir=tmp_path / "new")
            started.append(new.start())

            # The new server migrated the database with the old one up, as far as the rule
            # lets it beside that server: the expand steps (a contract one would wait). The
            # old server says its schema if its release has the rule, else nothing.
            code = migrations.code_version()
            with psycopg.connect(main) as conn:
                live = membership.live_schemas(conn)
                old_says = [s for s in live if s != code]
                assert sorted(live, key=lambda s: s or 0) == [*old_says, code]
                assert old_says in ([None], [old_schema])
                known = migrations.load()
                steps = migrations.plan(old_schema, 1, old_says, known)
                applied = [m.version for m in steps.apply]
                assert migrations.database_version(conn) == old_schema + len(applied)
                # A contract migration would wait while the old server is up.
                after = migrations.Migration(code + 1, "contract", "", contract=True)
                assert migrations.plan(code, 1, live, [*known, after]).waiting == [after]
            assert applied or steps.waiting
            if applied:
                assert f"applied migrations {applied}" in new.stderr()
            if steps.waiting:
                assert f"contract migrations {[m.version for m in steps.waiting]} wait" in (
                    new.stderr()
                )

            # A node through each server, a job through each server's API on the other's.
            token = create_token(cli, files.cli_env, "--max-uses", "0")
            for address in (OLD, NEW):
                # The previous release's agents: they are upgraded after every server (an
                # agent newer than a server may refuse its work: this one's would refuse
                # the previous release's unsigned attempts).
                agent = AgentProcess.joining(
                    tmp_path / f"node-{address}", [f"{address}:7443"], files.ca_hash, token=token
                )
                agent.code = tree
                agents.append(agent.start())
            on_old, on_new = (
                a.wait_status(lambda s: s.get("runtime") == "running", timeout=60)["node_id"]
                for a in agents
            )
            with psycopg.connect(main) as conn:
                streams: dict[str, str] = dict(
                    conn.execute(
                        "SELECT n.id, s.advertise FROM nodes n JOIN servers s ON s.id = n.server"
                    ).fetchall()
                )
            assert streams == {on_old: OLD, on_new: NEW}
            for through, node, other in ((OLD, on_new, NEW), (NEW, on_old, OLD)):
                client = pinned(files, through)
                job = run_job(client, node, f"through {through}, on a node of {other}")
                assert (job["state"], job["exit_code"]) == ("succeeded", 0), why(job, started)
                chunks = client.get(f"/api/v1/jobs/{job['id']}/output")["chunks"]
                text = b"".join(base64.b64decode(c["data"]) for c in chunks)
                assert text == f"through {through}, on a node of {other}\n".encode()

            # The old server still answers after all that, and counts both servers up.
            info = pinned(files, OLD).get("/api/v1/cluster")
            assert sorted(s["advertise"] for s in info["servers"]) == [OLD, NEW]
            assert old.process is not None and old.process.poll() is None

            # A job started with a server of the previous release up (its parts activities,
            # unless that release streamed them already) runs to its end across that
            # server's stop, on this release's.
            streamed_before = old_schema >= inputs.STREAMED_SCHEMA
            client = pinned(files, NEW)
            across: dict[str, Any] = client.post(
                "/api/v1/jobs",
                {
                    "tenant": "default",
                    "node": on_new,
                    "command": ["sh", "-c", "sleep 4; echo across"],
                },
            )
            wait_until(
                lambda: attempts_streamed(main, across["id"]) == [streamed_before],
                JOB_BOUND,
                "placed",
            )
            old.stop()
            started.remove(old)
            done = wait_ended(client, across)
            assert (done["state"], done["exit_code"]) == ("succeeded", 0), why(done, started)
            # Every server up at this release: jobs stream their parts, to every agent
            # that takes them so; the previous release's agents get activities still (those
            # of a release that streamed, the stream).
            wait_until(
                lambda: live_schemas(main) == [code], JOB_BOUND, "only this release's server up"
            )
            job = run_job(client, on_old, "an old agent, every server new")
            assert (job["state"], job["exit_code"]) == ("succeeded", 0), why(job, started)
            assert attempts_streamed(main, job["id"]) == [streamed_before]
            upgraded = agents[1]
            upgraded.stop(end_attempts=False)
            agents[1] = AgentProcess.resuming(upgraded.data_dir).start()  # this release's
            agents[1].wait_status(lambda s: s.get("runtime") == "running", timeout=60)
            wait_until(
                lambda: takes_stream(main, on_new),
                JOB_BOUND,
                "the new agent says it takes the stream",
            )
            job = run_job(client, on_new, "a new agent, every server new")
            assert (job["state"], job["exit_code"]) == ("succeeded", 0), why(job, started)
            assert attempts_streamed(main, job["id"]) == [True]
        finally:
            for agent in agents:
                agent.stop()
            kill_all(started)
