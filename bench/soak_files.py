"""The soak's files (issue 44): a file's content stored in the cluster before the job
that places it (`job run --file`) or pushes it (`file push`) is sent, the CLI's way
(cli/file_upload.py); and each push followed to its end, then its destination read on
every node it reported on, from the node's own disk (the agents run on this machine:
DATA_DIR/files/NAME), for the checker's `file_differs`.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import trio

from bench.soak_check import ENDED
from bench.soak_model import PushedFile, PushRecord
from bench.soak_state import Soak
from bench.soak_workload import Content, JobPlan
from cli.client import ApiError
from cli.file_results import push_results
from cli.file_upload import upload
from oz0_node.jobs.file_push import FILES_DIR

FOLLOW_EVERY = 2.0


async def store_file(soak: Soak, content: Content) -> bool:
    """CONTENT stored in the cluster; False when the API refused or none answered."""
    source = soak.bench.root / "files" / content.name
    source.parent.mkdir(exist_ok=True)
    source.write_bytes(content.data())
    client = soak.client()
    try:
        await trio.to_thread.run_sync(
            lambda: upload(client, "default", source), limiter=soak.limiter
        )
    except ApiError as e:
        soak.api_errors[f"file upload: {str(e).split(':')[0][:80]}"] += 1
        return False
    finally:
        client.close()
    return True


async def follow_push(soak: Soak, job_id: str, job: JobPlan, sent: float) -> None:
    """Push JOB_ID followed until it ended (or its bound passed: `not_terminal` judges
    that), then each node's file read back."""
    assert job.file is not None
    ended: dict[str, Any] | None = None
    while time.time() < sent + job.bound:
        answer = await soak.call("GET", f"/api/v1/jobs/{job_id}")
        if answer is not None and answer["state"] in ENDED:
            ended = answer
            break
        await trio.sleep(FOLLOW_EVERY)
    if ended is None:
        return
    results = await said(soak, ended)
    if results is None:
        soak.pushes_unread["its results not read"] += 1
        return
    nodes = []
    homes = {a.node_id: a for a in soak.fleet.agents if not a.gone}
    for result in results:
        agent = homes.get(result["node"])
        if agent is None:
            soak.pushes_unread["its node purged"] += 1
            continue
        path = agent.data_dir / FILES_DIR / job.file.name
        found = await trio.to_thread.run_sync(sha256_of, path)
        nodes.append(PushedFile(result["node"], result["attempt"], result["result"], found))
    soak.pushes.append(PushRecord(job_id, soak.minute(sent), job.file.sha256, tuple(nodes)))


async def said(soak: Soak, job: dict[str, Any]) -> list[dict[str, Any]] | None:
    """What each node of push JOB said (cli/file_results.py), a few tries."""
    for _ in range(5):
        client = soak.client()
        try:
            return await trio.to_thread.run_sync(
                lambda c=client: push_results(c, job),  # type: ignore[misc]
                limiter=soak.limiter,
            )
        except ApiError:
            await trio.sleep(FOLLOW_EVERY)
        finally:
            client.close()
    return None


def sha256_of(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
