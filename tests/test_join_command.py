"""The join command's shell text, run by a real `sh` with a fake `curl` first on PATH that
stands in for servers that are down or serve another file (a real download, server and
agent: tests/test_agent_file.py). The fakes write what they saw to $OZ0_TEST_OUT: the
line runs them in a private directory of their own, removed when the agent ends."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from oz0.server.join_command import render

TOKEN = "tok-0123456789ab.s3cr3t-_AZ"
CA_HASH = "sha256:" + "ab" * 32
# The "agent": writes down its arguments, environment and where it ran, then exits 5.
AGENT = b"""#!/bin/sh
printf '%s\\n' "$@" > "$OZ0_TEST_OUT/agent-args"
env > "$OZ0_TEST_OUT/agent-env"
echo "$PWD $(stat -c %a .)" > "$OZ0_TEST_OUT/agent-dir"
exit 5
"""
AGENT_SHA = hashlib.sha256(AGENT).hexdigest()

# Answers each URL as served.json says: a file's bytes, or a failure (curl's exit code 7:
# could not connect). Writes only with -o, like curl -f.
FAKE_CURL = """#!/usr/bin/python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["OZ0_TEST_OUT"] + "/curl-calls", "a") as calls:
    calls.write(json.dumps(args) + "\\n")
served = json.load(open(sys.argv[0] + ".json"))
answer = served.get(args[-1])
if answer is None:
    sys.exit(7)
with open(args[args.index("-o") + 1], "wb") as out:
    out.write(answer.encode("latin-1"))
"""


def fake_bin(where: Path, served: dict[str, bytes]) -> Path:
    fake = where / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "curl").write_text(FAKE_CURL)
    (fake / "curl").chmod(0o755)
    (fake / "curl.json").write_text(json.dumps({k: v.decode("latin-1") for k, v in served.items()}))
    return fake


def run(
    tmp_path: Path, command: str, served: dict[str, bytes], shell: str = "sh"
) -> subprocess.CompletedProcess[str]:
    """COMMAND run by SHELL in tmp_path/work, with tmp_path/tmp as its TMPDIR."""
    fake = fake_bin(tmp_path, served)
    for name in ("work", "out", "tmp"):
        (tmp_path / name).mkdir(exist_ok=True)
    return subprocess.run(
        ["env", "-i", f"PATH={fake}:/usr/bin:/bin", "HOME=/nonexistent",
         f"TMPDIR={tmp_path / 'tmp'}", f"OZ0_TEST_OUT={tmp_path / 'out'}", shell, "-c", command],
        cwd=tmp_path / "work", capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def url(host: str) -> str:
    return f"https://{host}:8443/agent/oz0-node"


def test_the_first_server_that_serves_the_file_is_used_and_the_token_stays_out_of_argv(
    tmp_path: Path,
) -> None:
    command = render(TOKEN, CA_HASH, ["10.0.0.11", "10.0.0.12", "10.0.0.13"], AGENT_SHA)
    done = run(tmp_path, command, {url("10.0.0.12"): AGENT, url("10.0.0.13"): AGENT})
    out = tmp_path / "out"
    # The agent's own exit status is the command's.
    assert done.returncode == 5, done.stderr
    # It ran in a private directory of its own under TMPDIR, removed once it ended; the
    # current directory is left as it was.
    ran_in, mode = (out / "agent-dir").read_text().split()
    assert Path(ran_in).parent == tmp_path / "tmp" and mode == "700"
    assert list((tmp_path / "tmp").iterdir()) == list((tmp_path / "work").iterdir()) == []
    assert (out / "agent-args").read_text().splitlines() == [
        "start", "--ca-hash", CA_HASH,
        "--edge", "10.0.0.11:7443", "--edge", "10.0.0.12:7443", "--edge", "10.0.0.13:7443",
    ]  # fmt: skip
    assert f"OZ0_JOIN_TOKEN={TOKEN}" in (out / "agent-env").read_text().splitlines()
    calls = [json.loads(line) for line in (out / "curl-calls").read_text().splitlines()]
    # The down server, then the next; the third is never asked.
    assert [c[-1] for c in calls] == [url("10.0.0.11"), url("10.0.0.12")]
    # -k: the SHA-256 check is what makes an unchecked TLS peer safe.
    assert all("-fsSk" in c for c in calls)
    assert not any(TOKEN in arg for c in calls for arg in c)


def test_a_file_with_another_sha256_is_deleted_and_never_run(tmp_path: Path) -> None:
    impostor = b"#!/bin/sh\ntouch ran\n"
    command = render(TOKEN, CA_HASH, ["10.0.0.11", "10.0.0.12"], AGENT_SHA)
    (tmp_path / "work").mkdir()
    # What a user had there before stays as it was.
    (tmp_path / "work" / "oz0-node").write_bytes(b"old")
    done = run(tmp_path, command, {url("10.0.0.11"): impostor, url("10.0.0.12"): AGENT + b" "})
    work = tmp_path / "work"
    assert done.returncode != 0
    assert done.stderr == (
        f"oz0-node: no server gave the agent file with SHA-256 {AGENT_SHA} (tried 2)\n"
    )
    assert [p.name for p in work.iterdir()] == ["oz0-node"]
    assert (work / "oz0-node").read_bytes() == b"old"
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "out" / "agent-args").exists()


# A user ID no account has (not nobody, whose files in /tmp tests/test_agent_file.py
# watches, maybe at the same time).
STRANGER = 12345


@pytest.fixture
def shared_machine() -> Iterator[Path]:
    """A directory any user can reach (pytest's temp tree is root's alone): the line is
    pasted there as STRANGER, so a directory of root's is one it cannot write."""
    machine = Path(tempfile.mkdtemp(prefix="oz0-join-line-"))
    machine.chmod(0o755)
    try:
        yield machine
    finally:
        shutil.rmtree(machine)


def test_pasted_in_an_unwritable_directory_holding_an_oz0_node_it_runs_the_agent_and_leaves_it_all(
    shared_machine: Path,
) -> None:
    fake = fake_bin(shared_machine, {url("10.0.0.11"): AGENT})
    work, out, tmp = shared_machine / "work", shared_machine / "out", shared_machine / "tmp"
    work.mkdir()
    # Root's, as are the files in it: what a user running the line finds in a shared place.
    for name in ("oz0-node", "oz0-node.part"):
        (work / name).write_bytes(b"#!/bin/sh\ntouch $OZ0_TEST_OUT/impostor-ran\n")
        (work / name).chmod(0o755)
    for owned in (out, tmp):
        owned.mkdir()
        os.chown(owned, STRANGER, STRANGER)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in work.iterdir()}
    # Pasted: the shell reads the line from its input, as from a terminal.
    done = subprocess.run(
        ["setpriv", f"--reuid={STRANGER}", f"--regid={STRANGER}", "--clear-groups",
         "env", "-i", f"PATH={fake}:/usr/bin:/bin", "HOME=/nonexistent", f"TMPDIR={tmp}",
         f"OZ0_TEST_OUT={out}", "sh"],
        input=render(TOKEN, CA_HASH, ["10.0.0.11"], AGENT_SHA) + "\n",
        cwd=work, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert (out / "agent-args").read_text().splitlines()[:1] == ["start"]
    assert not (out / "impostor-ran").exists()
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in work.iterdir()} == before
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_ipv6_addresses_are_bracketed_and_quoted_against_globbing(
    tmp_path: Path, shell: str
) -> None:
    command = render(TOKEN, CA_HASH, ["fd00::11"], AGENT_SHA)
    work = tmp_path / "work"
    work.mkdir()
    # Unquoted, `[fd00::11]` is a glob, and these paths would match it.
    (work / "https:" / "f:8443" / "agent").mkdir(parents=True)
    (work / "https:" / "f:8443" / "agent" / "oz0-node").write_text("")
    (work / "1:7443").write_text("")
    done = run(tmp_path, command, {url("[fd00::11]"): AGENT}, shell)
    assert done.returncode == 5, done.stderr
    args = (tmp_path / "out" / "agent-args").read_text().splitlines()
    assert args[-2:] == ["--edge", "[fd00::11]:7443"]


def test_without_an_agent_file_it_starts_an_installed_agent() -> None:
    assert render(TOKEN, CA_HASH, ["10.0.0.11", "10.0.0.12"], None) == (
        f"OZ0_JOIN_TOKEN={TOKEN} oz0-node start --ca-hash {CA_HASH}"
        " --edge 10.0.0.11:7443 --edge 10.0.0.12:7443"
    )
