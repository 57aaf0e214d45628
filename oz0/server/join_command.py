"""The one shell command line a node joins with, as `token create`, its `--json` and the
web UI's token page give it (docs/manage-nodes.md, "Join a node").

Pasted on a machine that reaches a server, it downloads the agent file from the first
server that is up and serves the file with the SHA-256 the command names (so `curl -k`
is safe: a file that does not match is deleted, never run), into a fresh private
directory (`mktemp -d`, 0700), and starts it from there with every edge that is up, the
CA hash and the default data directory; when the agent ends, the directory goes. Never the
current directory: others may be able to write it (swap the file between its check and
its start, or plant a link where curl writes), and it is left as it was. The token goes in
the agent's environment, never in an argument (every user of a machine reads those).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import trio

from oz0 import membership
from oz0.agent_file import FILE_NAME
from oz0.agent_file.digest import served_sha256
from oz0.errors import Oz0Error
from oz0.server.edge.directory import edge_address
from oz0.store.pool import Database
from oz0_common.addresses import MANAGEMENT_PORT, host_port

# Per server: a server that is up answers at once, a slow network gets its 24 MB through.
CONNECT_TIMEOUT = 5
DOWNLOAD_TIMEOUT = 300


class NoServerUp(Oz0Error):
    pass


@dataclass(frozen=True)
class JoinCommand:
    text: str
    # None: this server has no agent file to serve, and the command runs an installed one.
    agent_sha256: str | None


def download_url(advertise: str) -> str:
    return f"https://{host_port(advertise, MANAGEMENT_PORT)}/agent/{FILE_NAME}"


def render(token: str, ca_hash: str, servers: Sequence[str], agent_sha256: str | None) -> str:
    """The command for TOKEN, reaching SERVERS (advertise addresses, tried in this order)."""
    q = shlex.quote

    def start(agent: str) -> str:
        edges = " ".join(f"--edge {q(edge_address(s))}" for s in servers)
        return f"OZ0_JOIN_TOKEN={q(token)} {agent} start --ca-hash {q(ca_hash)} {edges}"

    if agent_sha256 is None:
        return start(FILE_NAME)
    urls = " ".join(q(download_url(s)) for s in servers)
    fetch = (
        f"curl -fsSk --connect-timeout {CONNECT_TIMEOUT} --max-time {DOWNLOAD_TIMEOUT}"
        f' -o {FILE_NAME} "$oz0_url"'
    )
    check = f'echo "{agent_sha256}  {FILE_NAME}" | sha256sum -c --status'
    failed = (
        f'echo "oz0-node: no server gave the agent file with SHA-256 {agent_sha256}'
        f' (tried {len(servers)})" >&2; false'
    )
    # In a subshell, so the user's shell stays where it was; `exec`, so Ctrl-C reaches the
    # agent alone and the line goes on to remove the directory, ending with the agent's
    # status. The loop leaves the file only when one matched: every other try deletes it.
    return (
        f'oz0_dir=$(mktemp -d) && (cd "$oz0_dir" && for oz0_url in {urls}; do {fetch} && '
        f"{check} && break; rm -f {FILE_NAME}; done; if [ -f {FILE_NAME} ]; then chmod 700 "
        f"{FILE_NAME} && {start('exec ./' + FILE_NAME)}; else {failed}; fi); "
        'oz0_status=$?; rm -rf "$oz0_dir"; (exit $oz0_status)'
    )


def _servers(conn: psycopg.Connection[Any], own_id: str) -> list[str]:
    """Servers up, this one first: it is answering, so it is surely up."""
    rows = membership.servers_up(conn)
    rows.sort(key=lambda r: r.id != own_id)
    return [r.advertise for r in rows]


@dataclass(frozen=True)
class JoinOffer:
    """What a join command names besides the token: the servers up, the file's SHA-256."""

    servers: tuple[str, ...]
    agent_sha256: str | None

    def command(self, token: str, ca_hash: str) -> JoinCommand:
        return JoinCommand(
            render(token, ca_hash, self.servers, self.agent_sha256), self.agent_sha256
        )


async def offer(db: Database, own_id: str) -> JoinOffer:
    """Read before the token is made, so a cluster that cannot say where to join makes none."""
    servers = await db.transaction(lambda conn: _servers(conn, own_id))
    if not servers:
        raise NoServerUp("no server is up (their heartbeats are stale): no join command to give")
    return JoinOffer(tuple(servers), await trio.to_thread.run_sync(served_sha256))
