"""Files with a real server, real Temporal and real agents (127.0.0.22; .23 a rogue edge
that changes a byte in transit): `file push`, `job run --file`, `file pull`.

A file pushed to three agents arrives byte-identical with its mode; pushed again it is
`unchanged`; a destination outside what the node allows is refused and nothing is
written; a byte changed between the edge and the node is refused by the node, which
checks the SHA-256 its part's grant signed, and nothing is written. `job run --file`
puts its files in the attempt's working directory, the attempt's own, before the command.
`file pull` brings /etc/hostname back from three nodes into three folders, and refuses the
agent's key (read as the job's identity, which cannot).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from cli.client import ApiClient
from fixtures import rogue_edge
from fixtures.agent import AgentProcess
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, Served, StartServer
from fixtures.tls import as_our_client
from oz0.context import Context
from oz0.server.management import UPLOAD_BODY_SIZE
from oz0_common.file_push import (
    CHUNK,
    CHUNKS_PER_UPLOAD,
    DATA,
    GET,
    PIECE,
    READS_PER_STREAM,
    WINDOW,
)
from tests.conftest import CliRunner, create_token

# The module's server (`served`, tests/conftest.py), which most tests share: each pushes to
# nodes of its own. The push to every node (`--all`) has a cluster and server of its own.
SERVER = "127.0.0.22"
ADVERTISE = SERVER
EDGE = f"{SERVER}:7443"
OWN_CLUSTER_ADVERTISE = "127.0.0.24"
OWN_EDGE = f"{OWN_CLUSTER_ADVERTISE}:7443"
ROGUE = "127.0.0.23:7443"
RUNNING = 60


def start_agent(
    agents: list[AgentProcess], data_dir: Path, edge: str, files: ClusterFiles, token: str,
    *extra: str,
) -> AgentProcess:  # fmt: skip
    agent = AgentProcess.joining(data_dir, [edge], files.ca_hash, token=token)
    agent.args += list(extra)
    agents.append(agent.start())
    return agent


@contextlib.asynccontextmanager
async def behind_rogue(
    cli: CliRunner,
    files: ClusterFiles,
    agents: list[AgentProcess],
    data_dir: Path,
    *,
    rewrite: Callable[[dict[str, Any]], dict[str, Any]],
    upward: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
) -> AsyncIterator[str]:
    """A rogue edge (REWRITE, UPWARD: rogue_edge.running's) before the server's, and an
    agent joined through it and running: its node ID."""
    async with rogue_edge.running(
        files, ROGUE, upstream=EDGE, node_dir=data_dir, rewrite=rewrite, upward=upward
    ):
        token = await trio.to_thread.run_sync(create_token, cli, files.cli_env)
        agent = start_agent(agents, data_dir, ROGUE, files, token)
        status = await trio.to_thread.run_sync(
            agent.wait_status, lambda s: s.get("runtime") == "running", RUNNING
        )
        yield str(status["node_id"])


def results(pushed: dict[str, Any]) -> dict[str, str]:
    [one] = pushed["pushes"]
    return {n["node"]: n["result"] for n in one["nodes"]}


@pytest.mark.slow
def test_push_to_three_agents_unchanged_and_refused_outside(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    env = cluster_files.cli_env
    token = create_token(cli, env, "--max-uses", "0")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    started = [
        start_agent(
            agents,
            tmp_path / f"node-{i}",
            OWN_EDGE,
            cluster_files,
            token,
            "--push-dir",
            str(allowed),
        )
        for i in range(3)
    ]
    ids = [
        a.wait_status(lambda s: s.get("runtime") == "running", RUNNING)["node_id"] for a in started
    ]
    content = os.urandom(200_000) + b"\nthe end\n"  # several chunks, the last one short
    source = tmp_path / "app.conf"
    source.write_bytes(content)

    pushed = cli("file", "push", str(source), "--dest", "conf/app.conf", "--mode", "0640",
                 "--all", "--json", env=env)  # fmt: skip
    assert pushed.code != 0, "conf/ does not exist yet in the agents' files/"
    assert all(r.startswith("error: ") for r in results(pushed.json()).values())

    pushed = cli("file", "push", str(source), "--dest", "app.conf", "--mode", "0640",
                 "--all", "--json", env=env)  # fmt: skip
    assert pushed.code == 0, pushed.out + pushed.err
    assert results(pushed.json()) == dict.fromkeys(ids, "written")
    for agent in started:
        written = agent.data_dir / "files" / "app.conf"
        assert written.read_bytes() == content
        assert stat.S_IMODE(written.stat().st_mode) == 0o640
        assert [p.name for p in written.parent.iterdir()] == ["app.conf"], "no temporary left"
    job_id = pushed.json()["pushes"][0]["job"]
    shown = cli("job", "show", job_id, env=env)
    assert shown.code == 0 and shown.out.count("written") == 3, shown.out

    again = cli("file", "push", str(source), "--dest", "app.conf", "--mode", "0640",
                "--all", "--json", env=env)  # fmt: skip
    assert again.code == 0, again.out + again.err
    assert results(again.json()) == dict.fromkeys(ids, "unchanged")

    # Outside what the node allows: refused, nothing written.
    outside = tmp_path / "outside"
    outside.mkdir()
    refused = cli("file", "push", str(source), "--dest", str(outside / "app.conf"),
                  "--owner", "nobody", "--node", ids[0], "--json", env=env)  # fmt: skip
    assert refused.code == 1
    [line] = results(refused.json()).values()
    assert line.startswith("error: this node lets pushes write only in"), line
    assert list(outside.iterdir()) == []
    # In a --push-dir, owned by root: refused without --push-root-owned; as nobody, written.
    root_owned = cli("file", "push", str(source), "--dest", str(allowed / "x.conf"),
                     "--node", ids[0], "--json", env=env)  # fmt: skip
    [line] = results(root_owned.json()).values()
    assert root_owned.code == 1 and "does not allow root-owned pushes" in line, line
    as_nobody = cli("file", "push", str(source), "--dest", str(allowed / "x.conf"),
                    "--owner", "nobody", "--node", ids[0], "--json", env=env)  # fmt: skip
    assert as_nobody.code == 0, as_nobody.out + as_nobody.err
    assert (allowed / "x.conf").read_bytes() == content
    assert (allowed / "x.conf").stat().st_uid == 65534

    # `job run --file`: in the working directory, the attempt's own, before the command.
    script = tmp_path / "script.sh"
    script.write_bytes(b"echo from the file\n")
    shell = 'sha256sum app.conf; sh run.sh; stat -c "%u %a" app.conf; id -u; ls -A'
    ran = cli("job", "run", "--node", ids[1], "--file", str(source), "--file",
              f"{script}:run.sh", "--", "sh", "-c", shell, env=env)  # fmt: skip
    assert ran.code == 0, ran.out + ran.err
    digest, echoed, owner, uid, *listing = ran.out.splitlines()
    assert digest.split()[0] == hashlib.sha256(content).hexdigest()
    assert echoed == "from the file"
    assert owner == f"{uid} 600" and uid != "0"
    assert {"app.conf", "run.sh"} <= set(listing), listing

    # `file pull`: one folder per node; the agent's key is not the job's to read.
    back = tmp_path / "back"
    pulled = cli("file", "pull", "/etc/hostname", "--all", "--to", str(back), "--json", env=env)
    assert pulled.code == 0, pulled.out + pulled.err
    hostname = Path("/etc/hostname").read_bytes()
    assert sorted(p.name for p in back.iterdir()) == sorted(ids)
    assert all((back / i / "hostname").read_bytes() == hostname for i in ids)
    key = started[0].data_dir / "identity" / "node.key"
    refused_key = cli("file", "pull", str(key), "--node", ids[0], "--to", str(back),
                      "--json", env=env)  # fmt: skip
    assert refused_key.code == 1, refused_key.out
    [node_said] = refused_key.json()["nodes"]
    assert node_said["result"].startswith("error: ") and not node_said["ok"], node_said
    assert not (back / ids[0] / "node.key").exists()

    listed = cli("file", "list", "--json", env=env)
    assert listed.code == 0, listed.err
    by_name = {f["name"]: f for f in listed.json()}
    assert by_name["app.conf"]["sha256"] == hashlib.sha256(content).hexdigest()
    assert by_name["app.conf"]["size"] == len(content) and by_name["app.conf"]["complete"]
    sha256 = by_name["app.conf"]["sha256"]
    shown = cli("file", "show", sha256, "--json", env=env)
    assert shown.code == 0 and job_id in shown.json()["jobs"], shown.out + shown.err
    assert cli("file", "delete", sha256, env=env).code == 0
    assert sha256 not in {f["sha256"] for f in cli("file", "list", "--json", env=env).json()}

    # A tenant's cap on one file: past it, one line, nothing stored, no job.
    assert cli("tenant", "set", "default", "--max-file-size", "100K", env=env).code == 0
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 200_000)
    over = cli("file", "push", str(big), "--dest", "big.bin", "--all", env=env)
    assert over.code != 0 and "more than tenant default's cap of 102400" in over.err, over.err
    assert "big.bin" not in {f["name"] for f in cli("file", "list", "--json", env=env).json()}


def flip_a_byte(message: dict[str, Any]) -> dict[str, Any]:
    """A file's first piece with one byte changed, as a tampering edge would send it."""
    if message.get("type") == DATA and message.get("offset") == 0 and "data" in message:
        data = bytearray(base64.b64decode(message["data"]))
        data[10] ^= 0x01
        message = {**message, "data": base64.b64encode(bytes(data)).decode()}
    return message


async def test_a_byte_changed_in_transit_is_refused_by_the_node(
    cli: CliRunner,
    served: Served,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    cluster_files = served.files
    env = cluster_files.cli_env
    data_dir = tmp_path / "node"
    async with behind_rogue(cli, cluster_files, agents, data_dir, rewrite=flip_a_byte) as node:
        source = tmp_path / "app.conf"
        source.write_bytes(b"x" * 100_000)
        pushed = await cli_async(cli, "file", "push", str(source), "--dest", "app.conf",
                                 "--node", node, "--json", env=env)  # fmt: skip
    assert pushed.code == 1, pushed.out + pushed.err
    [line] = results(pushed.json()).values()
    assert "has SHA-256" in line and "refused, nothing written" in line, line
    assert list((data_dir / "files").iterdir()) == [], "nothing written, no temporary left"


async def test_a_stream_has_at_most_its_cap_of_file_reads_at_once(
    cli: CliRunner,
    served: Served,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    """A node that asks for many pieces at once (here the rogue multiplies the agent's first
    file_get) has READS_PER_STREAM read at once by its edge; the others are answered
    `unavailable` at once, not queued. The reads are held by a lock on the table of rows,
    so none ends while they are counted."""
    cluster_files = served.files
    env = cluster_files.cli_env
    data_dir = tmp_path / "node"
    extra = 2 * READS_PER_STREAM
    locked = psycopg.connect(cluster_files.main_db)
    answers: list[dict[str, Any]] = []
    burst, enough = trio.Event(), trio.Event()
    # The agent's own window and the rogue's extra pieces, all asked at once: all but the
    # cap's are answered at once.
    asked = WINDOW + extra

    def multiply(message: dict[str, Any]) -> list[dict[str, Any]]:
        if message.get("type") != GET or burst.is_set():
            return [message]
        burst.set()
        # Held from before the first read reaches the edge until the test lets go.
        locked.execute("LOCK TABLE file_chunks IN ACCESS EXCLUSIVE MODE")
        # Offsets the agent never asks for: their answers reach no push of its own.
        more = [{**message, "offset": k * CHUNK + 7, "most": CHUNK} for k in range(1, extra + 1)]
        return [message, *more]

    def record(message: dict[str, Any]) -> dict[str, Any]:
        if message.get("type") == DATA:
            answers.append(message)
            if len(answers) >= asked - READS_PER_STREAM:
                enough.set()
        return message

    async with behind_rogue(
        cli, cluster_files, agents, data_dir, rewrite=record, upward=multiply
    ) as node:
        content = os.urandom(2 << 20)
        source = tmp_path / "big.bin"
        source.write_bytes(content)
        try:
            async with trio.open_nursery() as nursery:

                async def push() -> None:
                    args = ["file", "push", str(source), "--dest", "big.bin", "--node", node]
                    pushed = await cli_async(cli, *args, "--json", env=env)
                    assert pushed.code == 0, pushed.out + pushed.err
                    assert results(pushed.json()) == {node: "written"}

                nursery.start_soon(push)
                with trio.fail_after(RUNNING):
                    await burst.wait()
                with trio.fail_after(30):
                    await enough.wait()
                await trio.sleep(1.0)  # anything more would have come by now
                held = list(answers)
                locked.rollback()
        finally:
            locked.close()  # the lock goes with it, whatever happened
    refused = [a for a in held if a.get("error") == "unavailable"]
    read = [a for a in held if "data" in a]
    assert read == [], "no read ended while the rows were locked"
    assert len(refused) >= asked - READS_PER_STREAM, held
    assert (data_dir / "files" / "big.bin").read_bytes() == content


def curl_post(files: ClusterFiles, path: str, body: str) -> tuple[int, Any]:
    """POST BODY to PATH on SERVER with the admin's certificate; the status and the JSON."""
    context = files.context_dir
    done = subprocess.run(
        [
            "curl", "--silent", "--show-error", "--max-time", "20",
            "--cacert", str(context / "ca.crt"),
            "--cert", str(context / "operator.crt"),
            "--key", str(context / "operator.key"),
            "--header", "Content-Type: application/json", "--data-binary", "@-",
            "--write-out", "\n%{http_code}",
            *as_our_client(f"https://{SERVER}:8443{path}"),
        ],
        input=body, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    text, _, code = done.stdout.rpartition("\n")
    return int(code), json.loads(text)


def test_an_upload_route_takes_whole_rows_up_to_its_own_body_limit(
    served: Served,
) -> None:
    """The chunks' route takes CHUNKS_PER_UPLOAD rows (1 MiB) in one body, past the API's
    64 KiB; more than UPLOAD_BODY_SIZE is refused 413 there, and any other route keeps
    the 64 KiB."""
    cluster_files = served.files
    client = ApiClient(Context.load(cluster_files.context_path))
    content = os.urandom(CHUNKS_PER_UPLOAD * CHUNK + 10)
    sha256 = hashlib.sha256(content).hexdigest()
    registered = client.post(
        "/api/v1/files", {"tenant": "default", "sha256": sha256, "size": len(content), "name": "m"}
    )
    assert registered["chunks_per_upload"] == CHUNKS_PER_UPLOAD
    assert len(registered["missing"]) == CHUNKS_PER_UPLOAD + 1

    def chunks(seq: int, data: bytes) -> Any:
        body = {"tenant": "default", "seq": seq, "data": base64.b64encode(data).decode()}
        return client.post(f"/api/v1/files/{sha256}/chunks", body)

    assert chunks(0, content[: CHUNKS_PER_UPLOAD * CHUNK]) == {"complete": False}
    # Refused by size, in the API's JSON: sent by curl, which reads the 413 the server
    # answers (and closes on) while the body is still going out.
    big = base64.b64encode(os.urandom(UPLOAD_BODY_SIZE)).decode()
    for path, body in (
        (f"/api/v1/files/{sha256}/chunks", {"tenant": "default", "seq": 0, "data": big}),
        ("/api/v1/tokens", {"tenant": "default", "description": "x" * 70_000}),
    ):
        code, answer = curl_post(cluster_files, path, json.dumps(body))
        assert code == 413 and "Too Large" in answer["error"], (path, code, answer)
    assert chunks(CHUNKS_PER_UPLOAD, content[CHUNKS_PER_UPLOAD * CHUNK :]) == {"complete": True}


def as_an_older_edge(message: dict[str, Any]) -> dict[str, Any]:
    """A piece cut to one row, as an edge from before `most` serves it."""
    if message.get("type") == DATA and "data" in message:
        data = base64.b64decode(message["data"])[:CHUNK]
        message = {**message, "data": base64.b64encode(data).decode()}
    return message


async def test_pieces_shorter_than_asked_have_their_rest_asked(
    cli: CliRunner,
    served: Served,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    cluster_files = served.files
    env = cluster_files.cli_env
    data_dir = tmp_path / "node"
    async with behind_rogue(cli, cluster_files, agents, data_dir, rewrite=as_an_older_edge) as node:
        content = os.urandom(PIECE * WINDOW + 3 * CHUNK + 5)
        source = tmp_path / "rows.bin"
        source.write_bytes(content)
        pushed = await cli_async(cli, "file", "push", str(source), "--dest", "rows.bin",
                                 "--node", node, "--json", env=env)  # fmt: skip
    assert pushed.code == 0, pushed.out + pushed.err
    assert (data_dir / "files" / "rows.bin").read_bytes() == content
