"""Node-supplied strings never drive an operator's terminal: the join refuses a hostname
that is not a host name (checked at the edge, real server on 127.0.0.91), and the CLI's
tables and `node show` escape whatever is not printable, also in rows written before
the rule (injected into PostgreSQL), while --json stays exact JSON."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from cli.output import print_table, terminal_safe
from fixtures import edge_client
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.edge_client import pinned_keys
from oz0 import node_strings
from tests.conftest import CliRunner

SERVER = "127.0.0.91"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
# Categories a terminal may act on or that hide or reorder text.
UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
HOSTILE = "evil\x1b]0;owned\x07\x1b[2J\nnode-000000000000\r\x9b31m\u202etxt.exe\u2066\u200b\x7f"


def unsafe(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES]


# --- escaping ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred", "\\x1b[31mred"),
        ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),
        ("bell\x07del\x7f", "bell\\x07del\\x7f"),
        ("c1\x85\x9b", "c1\\x85\\x9b"),
        ("\u202eabc\u2066\u2069", "\\u202eabc\\u2066\\u2069"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("\U000e0041tag", "\\U000e0041tag"),
    ],
)
def test_what_is_not_printable_is_escaped(raw: str, shown: str) -> None:
    assert terminal_safe(raw) == shown


@pytest.mark.parametrize("text", ["laptop-7", "a b", "é ü ß", "東京-1", "x=1,y=2", ""])
def test_printable_text_is_left_alone(text: str) -> None:
    assert terminal_safe(text) == text


@given(st.text())
def test_no_unsafe_character_survives_escaping(text: str) -> None:
    safe = terminal_safe(text)
    assert unsafe(safe) == []
    if text.isprintable():
        assert safe == text


def test_a_table_escapes_every_cell(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["ID", "HOSTNAME"], [["node-1", HOSTILE], ["node-2", None]])
    out = capsys.readouterr().out
    lines = out.split("\n")
    assert len(lines) == 4 and lines[-1] == ""  # header, two rows, nothing spliced in
    assert unsafe(out.replace("\n", "")) == []
    assert "\\x1b]0;owned\\x07" in lines[1]


# --- the join's rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    "hostname", ["laptop-7", "web01.eu.example.com", "Build_Box", "a" * 253, "", None]
)
def test_host_names_are_accepted(hostname: str | None) -> None:
    assert node_strings.check_hostname(hostname) == (hostname or "")


@pytest.mark.parametrize(
    "hostname",
    [HOSTILE, "a\nb", "a b", ".lead", "-lead", "ħost", "a" * 254, "x\u202e", 7, ["a"]],
)
def test_other_hostnames_are_refused(hostname: object) -> None:
    with pytest.raises(node_strings.UntrustedString, match="hostname"):
        node_strings.check_hostname(hostname)


@given(st.one_of(st.text(), st.text(alphabet="abc.-_\x1b\n\u202e09", max_size=300)))
def test_a_stored_hostname_is_always_plain_ascii(hostname: str) -> None:
    try:
        stored = node_strings.check_hostname(hostname)
    except node_strings.UntrustedString as refused:
        assert unsafe(str(refused)) == []  # the refusal itself is safe to print
        return
    assert stored == hostname and len(stored) <= node_strings.MAX_HOSTNAME
    assert stored.isascii() and stored.isprintable() and " " not in stored


@pytest.mark.parametrize(
    "labels",
    [
        {"os": "linux\x1b[2J"},
        {"os": "a\nb"},
        {"os": "\u202eexe"},
        {"OS": "linux"},
        {"k\x1b": "v"},
        {"os": "x" * 254},
        {f"k{i}": "v" for i in range(65)},
        ["os=linux"],
    ],
)
def test_bad_labels_are_refused(labels: object) -> None:
    with pytest.raises(node_strings.UntrustedString) as refused:
        node_strings.check_labels(labels)
    assert unsafe(str(refused.value)) == []


# --- a real server -------------------------------------------------------------------


def _count(files: ClusterFiles, sql: str) -> int:
    with psycopg.connect(files.url.conninfo) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_join_with_a_hostile_hostname_is_refused_and_stored_strings_print_escaped(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, SERVER)
    with trio.fail_after(60):
        keys = await pinned_keys(cluster_files, EDGE)
        refused = await edge_client.join(EDGE, keys, hostname=HOSTILE)
        bad_label = await edge_client.join(EDGE, keys, labels={"os": "linux\x1b[2J"})
        assert refused["type"] == bad_label["type"] == "error"
        assert refused["code"] == bad_label["code"] == "bad_request"
        assert "hostname" in refused["message"] and "is not a host name" in refused["message"]
        assert "label os" in bad_label["message"]
        # Refused: nothing stored, nothing audited.
        assert _count(cluster_files, "SELECT count(*) FROM nodes") == 0
        joins = "SELECT count(*) FROM audit_log WHERE action = 'node.join'"
        assert _count(cluster_files, joins) == 0

        joined = await edge_client.join(EDGE, keys, hostname="laptop-7", labels={"os": "linux"})
        assert joined["state"] == "pending"
    # A row from before the rule (or written around it): the CLI must still not pass it on.
    with psycopg.connect(cluster_files.url.conninfo) as conn:
        conn.execute(
            "UPDATE nodes SET hostname = %s, reason = %s, labels = %s WHERE id = %s",
            (HOSTILE, HOSTILE, json.dumps({"os": HOSTILE}), keys.node_id),
        )
        conn.execute(
            "UPDATE audit_log SET details = %s WHERE action = 'node.join'",
            (json.dumps({"hostname": HOSTILE}),),
        )

    async def shown(*args: str) -> str:
        done = await cli_async(cli, *args, env=cluster_env)
        assert done.code == 0, done.err
        out: str = done.out
        return out

    listed = await shown("node", "list")
    assert len(listed.splitlines()) == 2  # header and one row: no line smuggled in
    assert unsafe(listed.replace("\n", "")) == []
    assert "evil\\x1b]0;owned\\x07" in listed
    detail = await shown("node", "show", keys.node_id)
    assert unsafe(detail.replace("\n", "")) == []
    assert len(detail.splitlines()) == 10
    audit = await shown("audit", "list")
    assert unsafe(audit.replace("\n", "")) == []

    # JSON stays exact: the same string comes back.
    as_json: dict[str, Any] = json.loads(await shown("node", "show", keys.node_id, "--json"))
    assert as_json["hostname"] == as_json["reason"] == as_json["labels"]["os"] == HOSTILE
    listed_json = json.loads(await shown("node", "list", "--json"))
    assert listed_json[0]["hostname"] == HOSTILE
