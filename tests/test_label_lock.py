"""Node labels that a token does not set, restricted (issue 42), with one real server on
127.0.0.96 and real agents joining with the labels they claim (`oz0-node start --label`).

`token create --lock-labels`: the token's labels are all a node joining with it gets, and a
node that claims another is refused at its join, in one line, the token's use not spent,
the refusal audited. `cluster set --lock-node-labels`: the same for every token. Neither
can be turned on while a server of an earlier release is up (its edge would not keep it).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fixtures import scoped_people
from fixtures.agent import AgentProcess, connected
from fixtures.cluster import ClusterFiles, Served
from fixtures.scoped_people import Person
from oz0 import node_labels
from tests.conftest import CliRunner

ADDRESS = "127.0.0.96"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{ADDRESS}:7443"
JOIN_BOUND = 60.0
EXIT_BOUND = 60.0


@pytest.fixture(scope="module")
def root(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Person:
    """The cluster-wide admin, with a certificate and a web account."""
    made = scoped_people.make(
        served.files, tmp_path_factory.mktemp("people"), ADDRESS, "root", "admin", []
    )
    return made.signed_in()


def token(cli: CliRunner, files: ClusterFiles, *extra: str) -> dict[str, Any]:
    made = cli("token", "create", "--tenant", "default", "--max-uses", "0", "--label",
               "team=data", *extra, "--json", env=files.cli_env)  # fmt: skip
    assert made.code == 0, made.err
    value: dict[str, Any] = made.json()
    return value


def joining(
    files: ClusterFiles, where: Path, secret: str | None, labels: dict[str, str]
) -> AgentProcess:
    return AgentProcess.joining(where, [EDGE], files.ca_hash, token=secret, labels=labels).start()


def joined_labels(root: Person, agent: AgentProcess) -> dict[str, str]:
    node_id = agent.wait_status(connected, JOIN_BOUND)["node_id"]
    labels: dict[str, str] = root.ok("GET", f"/api/v1/nodes/{node_id}")["labels"]
    return labels


def refused_line(agent: AgentProcess) -> str:
    """The one line a refused agent ended with (it exits non-zero)."""
    assert agent.wait_exit(EXIT_BOUND) != 0, agent.log()
    lines = [line for line in agent.log().splitlines() if "refused the request" in line]
    assert len(lines) == 1, agent.log()
    return lines[0]


def uses(root: Person, token_id: str) -> int:
    [found] = [t for t in root.ok("GET", "/api/v1/tokens")["tokens"] if t["id"] == token_id]
    return int(found["uses"])


def refusals(root: Person, token_id: str) -> list[dict[str, Any]]:
    entries = root.ok("GET", f"/api/v1/audit?action=node.join.refused&target=token:{token_id}")
    return [e["details"] for e in entries["entries"]]


def test_a_locked_token_refuses_a_node_that_claims_labels_and_takes_one_that_does_not(
    served: Served, root: Person, cli: CliRunner, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    locked = token(cli, served.files, "--lock-labels")
    assert locked["lock_labels"] is True and locked["labels"] == {"team": "data"}

    claiming = joining(served.files, tmp_path / "claiming", locked["token"],
                     {"role": "db-prod", "team": "data"})  # fmt: skip
    agents.append(claiming)
    line = refused_line(claiming)
    assert line.endswith(
        "refused the request: label role=db-prod refused: this join token gives a node its"
        " token's labels only (team=data); start the agent without --label"
    ), line
    assert uses(root, locked["id"]) == 0, "a refused join spends no use"
    assert refusals(root, locked["id"]) == [
        {"reason": "labels_locked", "labels": {"role": "db-prod"}, "hostname": socket.gethostname()}
    ]
    # The token's own label claimed again adds nothing: let in, as a node claiming none.
    for name, claimed in (("same", {"team": "data"}), ("none", {})):
        agent = joining(served.files, tmp_path / name, locked["token"], claimed)
        agents.append(agent)
        assert joined_labels(root, agent) == {"team": "data"}, name
    assert uses(root, locked["id"]) == 2
    # An unlocked token still lets a node add a label of its own.
    unlocked = token(cli, served.files)
    assert unlocked["lock_labels"] is False
    free = joining(served.files, tmp_path / "free", unlocked["token"], {"role": "db-prod"})
    agents.append(free)
    assert joined_labels(root, free) == {"team": "data", "role": "db-prod"}
    listed = cli("token", "list", env=served.files.cli_env)
    assert "team=data (locked)" in listed.out


def test_the_cluster_setting_locks_every_tokens_labels_until_it_is_turned_off(
    served: Served, root: Person, cli: CliRunner, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    files = served.files
    unlocked = token(cli, files)
    shown = cli("cluster", "set", "--lock-node-labels", "--json", env=files.cli_env)
    assert shown.code == 0, shown.err
    assert shown.json()["lock_node_labels"] is True
    try:
        info = cli("cluster", "info", env=files.cli_env)
        assert "node labels: their join token's only (locked)" in info.out
        claiming = joining(files, tmp_path / "claiming", unlocked["token"], {"role": "db-prod"})
        agents.append(claiming)
        assert refused_line(claiming).endswith(
            "refused the request: label role=db-prod refused: this cluster gives a node its"
            " token's labels only (team=data); start the agent without --label"
        )
        assert [d["reason"] for d in refusals(root, unlocked["id"])] == ["labels_locked"]
        plain = joining(files, tmp_path / "plain", unlocked["token"], {})
        agents.append(plain)
        assert joined_labels(root, plain) == {"team": "data"}
        # A node without a token still brings its own: an operator sees them, pending.
        pending = joining(files, tmp_path / "pending", None, {"role": "db-prod"})
        agents.append(pending)
        node_id = pending.wait_status(lambda s: s.get("state") == "pending", JOIN_BOUND)["node_id"]
        assert root.ok("GET", f"/api/v1/nodes/{node_id}")["labels"] == {"role": "db-prod"}
    finally:
        off = cli("cluster", "set", "--no-lock-node-labels", "--json", env=files.cli_env)
        assert off.code == 0 and off.json()["lock_node_labels"] is False, off.err
    again = joining(files, tmp_path / "again", unlocked["token"], {"role": "db-prod"})
    agents.append(again)
    assert joined_labels(root, again) == {"team": "data", "role": "db-prod"}
    changes = root.ok("GET", "/api/v1/audit?action=cluster.set")["entries"]
    assert [e["details"] for e in changes] == [
        {"lock_node_labels": {"from": True, "to": False}},
        {"lock_node_labels": {"from": False, "to": True}},
    ]
    assert cli("cluster", "set", env=files.cli_env).err == (
        "error: nothing to change: give --audit-retention, --[no-]lock-node-labels,"
        " --[no-]session-record-input, --session-idle-timeout or --session-max-length\n"
    )


def test_no_lock_is_turned_on_while_a_server_of_an_earlier_release_is_up(
    served: Served, root: Person, cli: CliRunner
) -> None:
    files = served.files
    older = "server-0000000000ee"
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO servers (id, advertise, version, schema_version)"
            " VALUES (%s, '127.0.0.1', 'older', %s)",
            (older, node_labels.LOCK_SCHEMA - 1),
        )
        try:
            waits = "waits for the end of the upgrade: a server of an earlier release is up"
            made = cli("token", "create", "--tenant", "default", "--lock-labels",
                       env=files.cli_env)  # fmt: skip
            assert made.code == 1 and f"error: --lock-labels {waits}" in made.err, made.err
            locked = cli("cluster", "set", "--lock-node-labels", env=files.cli_env)
            assert locked.code == 1 and f"error: --lock-node-labels {waits}" in locked.err
            assert root.ok("GET", "/api/v1/cluster")["lock_node_labels"] is False
        finally:
            conn.execute("DELETE FROM servers WHERE id = %s", (older,))
    assert token(cli, files, "--lock-labels")["lock_labels"] is True


def test_the_web_form_makes_a_locked_token(served: Served, root: Person) -> None:
    status, page = root.web(
        "POST", "/tokens",
        {"tenant": "default", "ttl": "1h", "max_uses": "1", "labels": "team=web",
         "lock_labels": "on"},
    )  # fmt: skip
    assert status == 200, page[:500]
    made = [t for t in root.ok("GET", "/api/v1/tokens")["tokens"] if t["labels"] == {"team": "web"}]
    assert [t["lock_labels"] for t in made] == [True]
    status, page = root.web("GET", "/tokens")
    assert status == 200 and "(locked)" in page
