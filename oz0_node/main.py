"""`oz0-node`: the agent a node machine runs.

    oz0-node start --edge HOST:PORT[,HOST:PORT...] --ca-hash sha256:HEX \\
        [--token-file PATH] [--label KEY=VALUE ...] [--launcher PATH] [--data-dir DIR]
        [--job-user NAME | --job-uids FIRST-LAST] [--max-jobs N] [--session-users NAME,...]
    OZ0_JOIN_TOKEN=TOKEN oz0-node start ...   # the token from the environment instead
    oz0-node start [--data-dir DIR]          # resume from what DIR remembers
    oz0-node status [--data-dir DIR] [--json]
    oz0-node install-service [--data-dir DIR] [--binary PATH] [--unit-path PATH] [--force]

DIR: --data-dir, else OZ0_NODE_DATA_DIR, else /var/lib/oz0-node (root) or
~/.local/share/oz0-node (oz0_common.datadir).
"""

from __future__ import annotations

import json as json_module
import logging
import os
import pwd
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from oz0_common import __version__
from oz0_common.commands import run_command
from oz0_common.datadir import node_data_dir
from oz0_node import addresses, join_token, service
from oz0_node import status as status_mod
from oz0_node.errors import AgentError
from oz0_node.identity import MAX_JOBS, valid_max_jobs

if TYPE_CHECKING:
    from oz0_node.jobs.attempt_uids import UidRange

app = App(name="oz0-node", help="The orchestrator-zero node agent.", version=__version__)

DataDir = Annotated[
    Path | None,
    Parameter(
        name="--data-dir",
        help="The node's data directory (default: OZ0_NODE_DATA_DIR, else "
        "/var/lib/oz0-node for root, ~/.local/share/oz0-node for others).",
    ),
]
Many = Parameter(consume_multiple=True)

_CA_HASH = re.compile(r"sha256:[0-9a-f]{64}")


@app.command
def start(
    *,
    data_dir: DataDir = None,
    edge: Annotated[tuple[str, ...], Many] = (),
    ca_hash: str | None = None,
    token_file: Path | None = None,
    token: Annotated[str | None, Parameter(show=False)] = None,
    label: Annotated[tuple[str, ...], Many] = (),
    launcher: Path | None = None,
    job_user: str | None = None,
    job_uids: str | None = None,
    max_jobs: int | None = None,
    push_dir: Annotated[tuple[Path, ...], Many] = (),
    push_root_owned: Annotated[bool, Parameter(negative=())] = False,
    session_users: Annotated[tuple[str, ...], Many] = (),
    verbose: Annotated[bool, Parameter(negative=())] = False,
) -> int:
    """Join a cluster (first start) or resume, then stay connected until SIGINT or SIGTERM.

    Exits with status 0 when the cluster purges the node, after deleting DIR and the
    launcher.

    Parameters
    ----------
    data_dir
        Where the node keeps all it has (identity, plugins, tools, logs); later
        starts need only this.
    edge
        Edge addresses HOST:PORT of the cluster's servers (comma-separated or repeated).
    ca_hash
        The cluster CA's hash, sha256:HEX, as `orchestrator-zero cluster info` prints it.
    token_file
        A file (mode 0600) holding a join token: the node is accepted at once, in the
        token's tenant. Or put the token in the OZ0_JOIN_TOKEN environment variable.
    token
        Refused: a token on the command line is visible to every user of the machine.
    label
        KEY=VALUE labels of this node (repeat for several); used when joining.
    launcher
        The file that starts this agent (a script, or a symbolic link to one); a purge
        deletes it along with DIR, but only a regular file or the link itself, never what
        a link points to and never a directory. Remembered in DIR, so later starts need not
        repeat it. If never given, the `oz0-node` command that runs this agent is its
        launcher; run any other way (`python -m oz0_node.main`), it has none.
    job_user
        The account every job runs as when the agent runs as root, shared by all its jobs
        (weaker than the default: each attempt a UID of its own, see --job-uids);
        `--job-user root` runs them as root, and says so. An agent that is not root runs
        jobs as itself.
    job_uids
        FIRST-LAST: the UIDs the attempts of an agent running as root take, one each, for
        the attempt's life and its cleanup (default 61184-65519). The agent refuses to start
        if an account, a process or a file of the machine uses one.
    max_jobs
        How many job attempts this node runs at once, 1 to 256 (default 4); the cluster
        places no more on it. Remembered in DIR, so later starts need not repeat it.
    push_dir
        A directory `file push` may write in (repeat for several; its subdirectories
        too). Without: only DIR/files, where a relative destination goes.
    push_root_owned
        Let `file push` write files owned by root (with the agent running as root and no
        --owner, or --owner root) outside DIR/files.
    session_users
        Accounts a session (`node shell --user`, `node exec --user`) may run as, comma-
        separated or repeated; `root` only if listed. Without: none, each session runs as a
        UID of its own. Only for an agent running as root.
    verbose
        Log debug messages too.
    """
    # Here, not at the top: `status` and `--help` need not load the runtime (Temporal's
    # SDK, websockets), which takes most of a second.
    import trio

    from oz0_node import agent, join

    secret = join_token.read(token_file, token)
    options = agent.StartOptions(
        data_dir=node_data_dir(data_dir),
        edges=addresses.parse_cli(edge),
        ca_hash=_parse_ca_hash(ca_hash),
        request=join.JoinRequest(
            token=secret, labels=_parse_labels(label), hostname=socket.gethostname()
        ),
        launcher=_parse_launcher(launcher),
        default_launcher=console_script(sys.argv[0]),
        job_user=job_user,
        job_uids=_parse_job_uids(job_uids),
        max_jobs=_parse_max_jobs(max_jobs),
        push_dirs=tuple(d.absolute() for d in push_dir),
        push_root_owned=push_root_owned,
        session_users=_parse_session_users(session_users),
    )
    _configure_logging(verbose)
    purged = trio.run(agent.run_until_signalled, options)
    if purged is not None:
        print(purged.summary())
    return 0


@app.command
def status(
    *,
    data_dir: DataDir = None,
    json: Annotated[bool, Parameter(name="--json", negative=(), help="Print JSON.")] = False,
) -> int:
    """Show the node's identity and whether its agent is connected.

    Parameters
    ----------
    data_dir
        The node's data directory.
    """
    report = status_mod.read(node_data_dir(data_dir))
    if json:
        print(json_module.dumps(report, indent=2))
        return 0
    connected = report["connected"]
    print(f"node:      {report['node_id'] or '(not joined yet)'}")
    print(f"cluster:   {report['cluster']}")
    print(f"state:     {report['state']}")
    if connected:
        print(f"connected: yes, to server {report['server']}")
    else:
        print(f"connected: no{'' if report['running'] else ' (agent not running)'}")
    print(f"runtime:   {report['runtime']}")
    jobs = report.get("jobs")
    if isinstance(jobs, dict):
        at_once = f", at most {jobs['max_jobs']} at once" if "max_jobs" in jobs else ""
        print(
            f"jobs:      run as {jobs.get('job_user')}, tracked by {jobs.get('tracking')}" + at_once
        )
        if jobs.get("session_users"):
            print(f"sessions:  may run as {', '.join(jobs['session_users'])} (--session-users)")
        if jobs.get("not_run"):
            print(f"jobs:      NONE RUN: {jobs['not_run']}")
    cert = report["certificate"]
    if isinstance(cert, dict):
        if cert["expired"]:
            print(f"certificate: EXPIRED: {cert['advice']}")
        else:
            until, due = cert["not_after"], cert["renew_from"]
            print(f"certificate: valid until {until}, renewal due from {due}")
    return 0


@app.command(name="install-service")
def install_service(
    *,
    data_dir: DataDir = None,
    binary: Path | None = None,
    unit_path: Path | None = None,
    force: Annotated[bool, Parameter(negative=())] = False,
) -> int:
    """Write the systemd unit that runs this agent (`systemctl enable --now oz0-node` next).

    Parameters
    ----------
    binary
        The agent's executable the unit starts (default: this `oz0-node`). A purge deletes
        it, and the unit then never starts again.
    unit_path
        Where to write the unit (default: /etc/systemd/system/oz0-node.service for root,
        ~/.config/systemd/user/oz0-node.service for others).
    force
        Replace an existing unit that differs.
    """
    program = binary.expanduser().absolute() if binary is not None else None
    if program is None:
        program = console_script(sys.argv[0])
    if program is None:
        raise AgentError("this agent was not started as `oz0-node`; give --binary PATH")
    if not program.is_file() or not os.access(program, os.X_OK):
        raise AgentError(f"--binary {program} is not an executable file")
    euid = os.geteuid()
    target = (
        unit_path.expanduser().absolute()
        if unit_path is not None
        else service.default_unit_path(euid, Path.home())
    )
    directory = node_data_dir(data_dir)
    service.install(target, service.unit_text(program, directory, system=euid == 0), force=force)
    scope = "" if euid == 0 else " --user"
    print(f"wrote {target}: runs {program} start --data-dir {directory}")
    print(f"next: systemctl{scope} daemon-reload && systemctl{scope} enable --now oz0-node")
    return 0


def console_script(argv0: str) -> Path | None:
    """ARGV0 if it is the `oz0-node` console script; a module or any other program is not a
    launcher a purge may delete (`python -m oz0_node.main` runs oz0_node/main.py)."""
    path = Path(argv0)
    return path.expanduser().absolute() if path.name == "oz0-node" else None


def _parse_launcher(value: Path | None) -> Path | None:
    if value is None:
        return None
    path = value.expanduser().absolute()
    if path.is_dir():
        raise AgentError(f"--launcher must name a file, and {path} is a directory")
    return path


def _parse_job_uids(value: str | None) -> UidRange | None:
    if value is None:
        return None
    from oz0_node.jobs.attempt_uids import UidRange  # with the agent's start, not `status`

    try:
        return UidRange.parse(value)
    except ValueError as e:
        raise AgentError(str(e)) from None


def _parse_session_users(values: Sequence[str]) -> frozenset[str]:
    names = {n.strip() for v in values for n in v.split(",") if n.strip()}
    if names and os.geteuid() != 0:
        raise AgentError("--session-users needs an agent running as root (it runs as itself)")
    for name in sorted(names):
        try:
            pwd.getpwnam(name)
        except KeyError:
            raise AgentError(f"--session-users: there is no user {name} on this machine") from None
    return frozenset(names)


def _parse_max_jobs(value: int | None) -> int | None:
    if value is not None and not valid_max_jobs(value):
        raise AgentError(f"--max-jobs must be a whole number from 1 to {MAX_JOBS}, not {value}")
    return value


def _parse_ca_hash(value: str | None) -> str | None:
    if value is None:
        return None
    normalised = value.strip().lower()
    if not _CA_HASH.fullmatch(normalised):
        raise AgentError(f"--ca-hash must be sha256: and 64 hex digits, not {value!r}")
    return normalised


def _parse_labels(values: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key.strip():
            raise AgentError(f"--label must be KEY=VALUE, not {value!r}")
        labels[key.strip()] = text
    return labels


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Its debug output is every frame of every stream.
    logging.getLogger("trio-websocket").setLevel(logging.INFO)


def run(tokens: Sequence[str]) -> int:
    return run_command(app, tokens)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
