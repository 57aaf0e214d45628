"""`orchestrator-zero file ...`: put files on the fleet's nodes (docs/files.md)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

from cyclopts import App

from cli.client import ApiClient
from cli.completers import NodeOption, TenantName, TenantOption
from cli.file_results import push_results
from cli.file_upload import upload
from cli.job_cmds import DEFAULT_QUEUE_TIMEOUT, job_body
from cli.job_follow import ENDED_STATES
from cli.job_params import BatchShare, Selectors, usage_error
from cli.output import print_fields, print_json, print_table, terminal_safe
from cli.params import ContextPath, Flag, JsonFlag
from oz0 import node_rules
from oz0.context import select
from oz0.jobs.spec_text import DEFAULT_ON_LOST
from oz0_common.file_push import BadPush, PushOrder, is_sha256

app = App(name="file", help_format="markdown")  # help: cli/main.py


def _mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o7777:
        raise usage_error(f"invalid --mode {text!r}: give an octal mode such as 0644")
    return value


@app.command
def push(
    *sources: Path,
    dest: str,
    mode: str = "0644",
    owner: str | None = None,
    tenant: TenantName = node_rules.DEFAULT_TENANT,
    selector: Selectors = None,
    node: NodeOption = None,
    all: Flag = False,
    batch: BatchShare = None,
    detach: Flag = False,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Put files on nodes: each stored once in the cluster by its SHA-256, then written by
    each node's agent (atomically, with the mode and owner asked) as a job, one per file.

    Prints, per node, `written`, `unchanged` (it had that content already) or the error;
    exits 0 if every node has the file.

    Parameters
    ----------
    sources
        The files to push.
    dest
        Where each node writes it: an absolute path (in a directory the node lets pushes
        write: `oz0-node start --push-dir`), or a path relative to the agent's own
        files/ directory. With several files, the directory they go in.
    mode
        The file's mode, in octal.
    owner
        The file's owner, a user name or UID on the node (default: the agent's user).
    tenant
        The tenant whose nodes get it.
    selector
        KEY=VALUE: only nodes with this label; repeat for several (all must match).
    node
        Only this node (node-...).
    all
        Every node that matches now.
    batch
        With --all: at most N nodes (or P%) at once.
    detach
        Print the jobs' IDs and leave them running.
    json
        Print the outcome (or with --detach the jobs) as JSON.
    """
    if not sources:
        raise usage_error("file push needs a file to push, such as: file push app.conf --dest ...")
    file_mode = _mode(mode)
    orders: list[tuple[Path, str]] = []
    for source in sources:
        if not source.is_file():
            raise usage_error(f"{source} is not a file")
        target = dest if len(sources) == 1 else f"{dest.rstrip('/')}/{source.name}"
        orders.append((source, target))
    client = ApiClient(select(context))
    jobs = []
    for source, target in orders:
        sha256, size = upload(client, tenant, source)
        try:
            order = PushOrder(sha256, size, target, file_mode, owner)
        except BadPush as e:
            raise usage_error(str(e)) from None
        options = _options(tenant, selector, node, all, batch, f"push {source.name}")
        jobs.append(client.post("/api/v1/jobs", job_body(order.command(), options)))
    if detach:
        if json:
            print_json({"jobs": jobs})
        else:
            for job in jobs:
                print(terminal_safe(job["id"]))
        return 0
    outcomes = [_outcome(client, job["id"]) for job in jobs]
    if json:
        print_json({"pushes": outcomes})
    else:
        rows = [[o["dest"], r["node"], r["result"]] for o in outcomes for r in o["nodes"]]
        print_table(["DEST", "NODE", "RESULT"], rows)
        for o in outcomes:
            if o["state"] != "succeeded" and not o["nodes"]:
                print(terminal_safe(f"job {o['job']} {o['state']}: {o['reason']}"))
    return 0 if all_ok(outcomes) else 1


def all_ok(outcomes: list[dict[str, Any]]) -> bool:
    return all(o["state"] == "succeeded" for o in outcomes)


def _options(
    tenant: str,
    selector: list[str] | None,
    node: str | None,
    all: bool,
    batch: str | None,
    name: str,
) -> dict[str, Any]:
    """`job run`'s options (job_body) for a push: its defaults but where to run."""
    return {
        "tenant": tenant, "selector": selector, "node": node, "all": all, "timeout": None,
        "retries": 0, "env": None, "name": name, "no_move": False, "on_lost": DEFAULT_ON_LOST,
        "lost_after": None, "batch": batch, "batch_wait": None, "max_failures": None,
        "queue_timeout": DEFAULT_QUEUE_TIMEOUT, "secret_env": None, "memory": None,
        "cpu": None, "max_processes": None, "max_open_files": None,
        "max_address_space": None,
    }  # fmt: skip


def _outcome(client: ApiClient, job_id: str) -> dict[str, Any]:
    """JOB_ID followed to its end: per node, what its agent said."""
    job = _ended(client, job_id)
    order = PushOrder.of(job["command"])
    return {
        "job": job_id,
        "dest": order.dest if order is not None else "",
        "state": job["state"],
        "reason": job.get("reason"),
        "nodes": push_results(client, job),
    }


@app.command(name="list")
def list_(
    *, tenant: TenantOption = None, json: JsonFlag = False, context: ContextPath = None
) -> int:
    """The files stored for pushes, newest first."""
    found = ApiClient(select(context)).get("/api/v1/files", {"tenant": tenant})["files"]
    if json:
        print_json(found)
        return 0
    print_table(
        ["SHA256", "SIZE", "TENANT", "NAME", "COMPLETE", "ADDED", "BY"],
        [[f["sha256"][:16], f["size"], f["tenant"], f["name"], "yes" if f["complete"] else "no",
          f["created_at"][:19], f["created_by"]] for f in found],
    )  # fmt: skip
    return 0


def _check_sha(sha256: str) -> str:
    if not is_sha256(sha256):
        raise usage_error(f"invalid file {sha256!r}: files are named by their SHA-256 (64 hex)")
    return sha256


@app.command
def show(
    sha256: str,
    /,
    *,
    tenant: TenantName = node_rules.DEFAULT_TENANT,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """One stored file, and the newest jobs that name it."""
    found = ApiClient(select(context)).get(
        f"/api/v1/files/{_check_sha(sha256)}", {"tenant": tenant}
    )
    if json:
        print_json(found)
        return 0
    print_fields(
        [
            ("sha256", found["sha256"]),
            ("size", found["size"]),
            ("tenant", found["tenant"]),
            ("name", found["name"]),
            ("complete", "yes" if found["complete"] else "no"),
            ("added", f"{found['created_at']} by {found['created_by']}"),
            ("jobs", ", ".join(found["jobs"]) or "-"),
        ]
    )
    return 0


@app.command
def delete(
    sha256: str,
    /,
    *,
    tenant: TenantName = node_rules.DEFAULT_TENANT,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Forget a stored file for the tenant; the content goes at the pruner's next pass
    once no job names it (a queued or running one still gets it)."""
    gone = ApiClient(select(context)).request(
        "DELETE", f"/api/v1/files/{_check_sha(sha256)}?tenant={tenant}"
    )
    if json:
        print_json(gone)
    else:
        print(terminal_safe(f"deleted file {sha256} of tenant {tenant}"))
    return 0


@app.command
def pull(
    path: str,
    /,
    *,
    to: Path,
    tenant: TenantName = node_rules.DEFAULT_TENANT,
    selector: Selectors = None,
    node: NodeOption = None,
    all: Flag = False,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Bring a file back from nodes: DIR/<node-id>/<its name>, one folder per node.

    Read on each node by a job (`cat PATH`, as the job's own identity: what a job could not
    read, a pull cannot either), so its content is stored like job output, capped like it
    (1 MiB a node) and kept as long as jobs are. Exits 0 if every node's copy arrived.

    Parameters
    ----------
    path
        The file's absolute path on the nodes.
    to
        The local directory the copies go in.
    tenant
        The tenant whose nodes it is read on.
    selector
        KEY=VALUE: only nodes with this label; repeat for several (all must match).
    node
        Only this node (node-...).
    all
        Every node that matches now.
    json
        Print the outcome as JSON.
    """
    if not path.startswith("/") or path.endswith("/"):
        raise usage_error(f"file pull needs a file's absolute path, not {path!r}")
    name = path.rpartition("/")[2]
    client = ApiClient(select(context))
    options = _options(tenant, selector, node, all, None, f"pull {path}")
    job = client.post("/api/v1/jobs", job_body(["cat", "--", path], options))
    ended = _ended(client, job["id"])
    copies = pulled(client, ended)
    outcome = []
    for node_id, (code, out, err, truncated) in copies.items():
        if code == 0 and not truncated:
            folder = to / node_id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(out)
            result = f"{folder / name} ({len(out)} bytes)"
        elif truncated:
            result = "error: larger than a job's output cap (1 MiB)"
        else:
            said = err.decode("utf-8", "replace").strip().splitlines()
            result = "error: " + (said[-1] if said else f"exit code {code}")
        outcome.append({"node": node_id, "ok": code == 0 and not truncated, "result": result})
    if json:
        print_json({"job": job["id"], "state": ended["state"], "nodes": outcome})
    else:
        print_table(["NODE", "RESULT"], [[o["node"], o["result"]] for o in outcome])
        if not outcome:
            print(terminal_safe(f"job {job['id']} {ended['state']}: {ended.get('reason')}"))
    return 0 if outcome and all_ok_nodes(outcome) else 1


def all_ok_nodes(outcome: list[dict[str, Any]]) -> bool:
    return all(o["ok"] for o in outcome)


def _ended(client: ApiClient, job_id: str) -> dict[str, Any]:
    while True:
        job: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}")
        if job.get("state") in ENDED_STATES:
            return job
        time.sleep(0.2)


def pulled(
    client: ApiClient, job: dict[str, Any]
) -> dict[str, tuple[int | None, bytes, bytes, bool]]:
    """Per node, its last attempt's exit code, stdout, stderr and whether it was cut."""
    streams: dict[tuple[int, str], bytes] = {}
    after = 0
    while True:
        page = client.get(f"/api/v1/jobs/{job['id']}/output", {"after": after})
        for c in page["chunks"]:
            key = (c["attempt"], c["stream"])
            streams[key] = streams.get(key, b"") + base64.b64decode(c["data"])
        after = page["cursor"]
        if not page["more"]:
            break
    last: dict[str, dict[str, Any]] = {}
    for a in job["attempts"]:
        last[a["node"]] = a
    return {
        node: (
            a["exit_code"],
            streams.get((a["number"], "stdout"), b""),
            streams.get((a["number"], "stderr"), b""),
            bool(a["truncated"]),
        )
        for node, a in last.items()
    }
