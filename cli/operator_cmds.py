"""`orchestrator-zero operator ...`: the cluster's people (an admin's `add`, `list`,
`show`, `set`, `remove`), a new person's `enroll`, and everyone's own `renew`."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

from cryptography.hazmat.primitives import serialization
from cyclopts import App, Parameter

from cli.client import ApiClient
from cli.output import print_fields, print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0.context import select
from oz0.errors import Oz0Error
from oz0_common import certs
from oz0_common.files import write_private

app = App(name="operator", help_format="markdown")  # help: cli/main.py


@app.command
def renew(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Make a new key, have the cluster sign a 90-day certificate, replace both."""
    ctx = select(context)
    # The renewal voids the certificate this client holds: no second request with it.
    client = ApiClient(ctx, learn_servers=False)
    key = certs.new_private_key()
    csr = certs.make_csr(key, ctx.operator)
    answer = client.post(
        "/api/v1/operator/renew",
        {"csr": csr.public_bytes(serialization.Encoding.PEM).decode()},
    )
    cert_pem = str(answer["certificate"]).encode()
    cert = certs.cert_from_pem(cert_pem)
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise RuntimeError("the cluster signed a certificate for another key")
    # The old certificate is void from now on: write the key first, then the certificate.
    write_private(ctx.key_path, certs.key_to_pem(key))
    write_private(ctx.cert_path, cert_pem)
    if json:
        print_json({"operator": ctx.operator, "not_after": answer["not_after"]})
    else:
        print(f"operator {ctx.operator}: new certificate valid until {answer['not_after']}")
    return 0


RoleArg = Annotated[
    Literal["viewer", "operator", "admin"],
    Parameter(help="viewer (reads), operator (also runs jobs and changes nodes), admin (all)."),
]
TenantArgs = Annotated[
    list[str] | None,
    Parameter(
        name="--tenant",
        negative=(),
        help="A tenant the person's rights hold in; repeat for several. None: every tenant.",
    ),
]


@app.command
def add(
    name: str,
    /,
    *,
    role: RoleArg,
    tenant: TenantArgs = None,
    expires: str = "1h",
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Add person NAME: prints the one command it runs on its own machine to enroll.

    The command holds a one-time code (the cluster keeps only its hash), valid until
    `--expires`. An admin of some tenants adds people to its own tenants only.

    Parameters
    ----------
    name
        The person's name: its operator and web UI account (lowercase letters, digits,
        '.', '_', '-').
    expires
        How long the code works, such as 1h or 30m; at most 48h.
    """
    body = {"name": name, "role": role, "tenants": tenant or [], "expires": expires}
    added = ApiClient(select(context)).post("/api/v1/operators", body)
    added.pop("code", None)  # it is in the command, which is all the person needs
    if json:
        print_json(added)
        return 0
    print(
        f"{_described(added)} added; the code below works once, until "
        f"{_time(added['expires_at'])}. {name} runs on their own machine (the key is made "
        "there and never leaves it):"
    )
    print()
    print(added["enroll_command"])
    return 0


@app.command
def enroll(
    *,
    server: str,
    ca_hash: str,
    code_file: Path | None = None,
    web_password_file: Path | None = None,
    no_web: Annotated[bool, Parameter(negative=())] = False,
    operator_dir: Path | None = None,
    json: JsonFlag = False,
) -> int:
    """Become an operator with the code an admin's `operator add` printed (in
    OZ0_ENROLL_CODE, never an argument): makes your key here, gets its 90-day certificate
    and writes your CLI context.

    Parameters
    ----------
    server
        HOST or HOST:PORT of a server of the cluster.
    ca_hash
        The cluster CA's hash (sha256:HEX): the server must present that CA.
    code_file
        A file (mode 0600) holding the code, instead of OZ0_ENROLL_CODE.
    web_password_file
        A file (mode 0600) holding your web UI password; else it is asked twice.
    no_web
        No web UI account.
    operator_dir
        Where to write the context (default: the cluster's name in the config directory).
    """
    from cli import enroll as enrolling

    code = enrolling.read_code(code_file)
    password = enrolling.read_web_password(web_password_file, no_web)
    pinned = enrolling.pin(server, ca_hash)
    done = enrolling.enroll(pinned, code, password, operator_dir)
    answer = done.answer
    if json:
        print_json(
            {
                "operator": answer["name"], "role": answer["role"], "tenants": answer["tenants"],
                "cluster": done.context.cluster, "context": str(done.context.path),
                "not_after": answer["not_after"], "web_sign_in": answer["web_sign_in"],
            }
        )  # fmt: skip
        return 0
    web = "with" if answer["web_sign_in"] else "without"
    print(
        f"{_described(answer)} of cluster {done.context.cluster}, {web} web UI sign-in: "
        f"certificate valid until {_time(answer['not_after'])}"
    )
    print(f"export OZ0_CONTEXT={done.context.path}")
    return 0


@app.command(name="list")
def list_(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """The cluster's people (an admin of some tenants: those of its tenants), and those
    added who have not enrolled yet."""
    people = ApiClient(select(context)).get("/api/v1/operators")["operators"]
    if json:
        print_json(people)
        return 0
    print_table(
        ["NAME", "ROLE", "TENANTS", "STATE", "CERTIFICATE UNTIL", "LAST USED", "WEB"],
        [
            [
                p["name"], p["role"], _tenants(p["tenants"]), _state(p),
                _time(p["certificate_not_after"]), _time(p["last_used_at"]),
                "yes" if p["web_sign_in"] else "no",
            ]
            for p in people
        ],
    )  # fmt: skip
    return 0


@app.command
def show(name: str, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Person NAME: role, tenants, certificate, last use, web sign-in."""
    p = ApiClient(select(context)).get(f"/api/v1/operators/{_path(name)}")
    if json:
        print_json(p)
        return 0
    print_fields(
        [
            ("name", p["name"]), ("role", p["role"]), ("tenants", _tenants(p["tenants"])),
            ("state", _state(p)), ("certificate until", _time(p["certificate_not_after"])),
            ("last used", _time(p["last_used_at"])),
            ("web sign-in", "yes" if p["web_sign_in"] else "no"),
            ("added", _time(p["created_at"])),
        ]
    )  # fmt: skip
    return 0


@app.command(name="set")
def set_(
    name: str,
    /,
    *,
    role: Annotated[Literal["viewer", "operator", "admin"] | None, Parameter()] = None,
    tenant: TenantArgs = None,
    all_tenants: Annotated[bool, Parameter(negative=())] = False,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Change person NAME's role or tenants; every server acts on it within two seconds.

    Parameters
    ----------
    role
        The new role.
    all_tenants
        Its rights hold in every tenant (instead of --tenant).
    """
    if tenant and all_tenants:
        raise Oz0Error("give --tenant or --all-tenants, not both")
    body: dict[str, object] = {"role": role, "tenants": [] if all_tenants else tenant}
    if role is None and body["tenants"] is None:
        raise Oz0Error("nothing to change: give --role, --tenant or --all-tenants")
    p = ApiClient(select(context)).request("PATCH", f"/api/v1/operators/{_path(name)}", body)
    if json:
        print_json(p)
    else:
        print(f"{_described(p)}: changed; every server acts on it within two seconds")
        _print_ended(p)
    return 0


@app.command
def remove(name: str, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Remove person NAME: certificate, web UI account and sessions, or its pending code;
    its schedules paused until an admin takes them over, its join tokens revoked, the
    enrollments it made cancelled. Every server refuses it within two seconds."""
    removed = ApiClient(select(context)).request("DELETE", f"/api/v1/operators/{_path(name)}")
    if json:
        print_json(removed)
        return 0
    ended = removed["sessions_ended"]
    sessions = f", {ended} web session{'' if ended == 1 else 's'} ended" if ended else ""
    what = "its code void" if removed["was"] == "pending" else "its certificate refused"
    print(f"{_described(removed)} removed: {what}{sessions}")
    _print_ended(removed)
    return 0


def _print_ended(answer: dict[str, Any]) -> None:
    """What a removal or a change ended of what the person made, a line for each kind
    (none when it ended nothing)."""
    paused = answer.get("schedules_paused") or []
    if paused:
        print(
            f"paused {_count(len(paused), 'schedule')} until an admin takes"
            f" {'it' if len(paused) == 1 else 'them'} over (schedule set ID --owner NAME):"
            f" {', '.join(paused)}"
        )
    late = answer.get("schedules_not_paused_in_temporal") or []
    if late:
        print(
            f"  not paused in Temporal yet (their runs start nothing; the next one pauses"
            f" it): {', '.join(late)}"
        )
    revoked = answer.get("tokens_revoked") or []
    if revoked:
        print(f"revoked {_count(len(revoked), 'join token')}: {', '.join(revoked)}")
    cancelled = answer.get("enrollments_cancelled") or []
    if cancelled:
        print(f"cancelled {_count(len(cancelled), 'enrollment')} it made: {', '.join(cancelled)}")
    elsewhere = answer.get("ended_elsewhere") or 0
    if elsewhere:
        print(f"and ended {elsewhere} more in tenants that are not yours")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _described(p: dict[str, Any]) -> str:
    """`operator alice (viewer of acme)`, as refusals name a person."""
    where = f" of {', '.join(p['tenants'])}" if p["tenants"] else ""
    return f"operator {p['name']} ({p['role']}{where})"


def _tenants(tenants: list[str]) -> str:
    return ",".join(tenants) if tenants else "(all)"


def _state(p: dict[str, Any]) -> str:
    if p["state"] == "pending":
        return f"pending (code until {_time(p['enroll_expires_at'])})"
    return str(p["state"])


def _path(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _time(iso: str | None) -> str:
    if iso is None:
        return "-"
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
