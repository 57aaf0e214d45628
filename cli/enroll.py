"""`operator enroll`'s side: read the code and the web password, pin the cluster by its CA
hash, make the key here, and trade the code (with a certificate request) for a certificate.

The person has no certificate yet, so these calls present none. The first asks the server
for the cluster's CA on a connection that verifies nothing, and keeps it only if it hashes
to the `--ca-hash` the admin handed over; the code then goes only on a connection verified
against that CA, to a server certificate of that cluster.
"""

from __future__ import annotations

import getpass
import http.client
import json
import os
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cli.client import connection
from oz0.context import Context, check_address, config_home
from oz0.errors import Oz0Error
from oz0_common import certs

ENV_VAR = "OZ0_ENROLL_CODE"
PATH = "/api/v1/operator/enroll"
TIMEOUT = 15.0
# A code is 43 characters, a web password at most 1024: a file much longer is neither.
MAX_FILE_BYTES = 4096


class EnrollError(Oz0Error):
    pass


def read_code(code_file: Path | None) -> str:
    """The code, from OZ0_ENROLL_CODE or a 0600 file (not both), never from an argument:
    every user of a machine can read a process's arguments. The variable leaves this
    process's environment once read."""
    from_env = os.environ.pop(ENV_VAR, None)
    if code_file is not None and from_env is not None:
        raise EnrollError(f"give the enrollment code once: --code-file or {ENV_VAR}, not both")
    if code_file is not None:
        code = _read_secret_line(code_file, "enrollment code file")
    elif from_env is not None:
        code = from_env.strip()
    else:
        raise EnrollError(
            f"no enrollment code: set {ENV_VAR} (as the command `operator add` printed does) "
            "or give --code-file FILE (mode 0600)"
        )
    if not code or any(c.isspace() for c in code):
        raise EnrollError("the enrollment code must be one word, as `operator add` printed it")
    return code


def read_web_password(password_file: Path | None, no_web: bool) -> str | None:
    """The web UI password: from a 0600 file, asked twice on the terminal, or none."""
    if no_web:
        if password_file is not None:
            raise EnrollError("give --web-password-file or --no-web, not both")
        return None
    if password_file is not None:
        return _read_secret_line(password_file, "web password file")
    if not sys.stdin.isatty():
        raise EnrollError(
            "no terminal to ask the web UI password on: give --web-password-file FILE "
            "(mode 0600) or --no-web"
        )
    password = getpass.getpass("Web UI password (12 characters or more): ")
    if getpass.getpass("The same again: ") != password:
        raise EnrollError("the passwords differ; run the command again")
    return password


def _read_secret_line(path: Path, what: str) -> str:
    path = path.expanduser().absolute()
    raw = certs.read_private(path, what, EnrollError, MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise EnrollError(f"{what} {path} is too long")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise EnrollError(f"{what} {path} is not UTF-8 text") from None
    # One line; its newline is the file's, not the secret's.
    return text.removesuffix("\n").removesuffix("\r")


@dataclass(frozen=True)
class Pinned:
    server: str
    cluster: str
    ca_hash: str
    ca_pem: bytes


def pin(server: str, expected_hash: str) -> Pinned:
    """The cluster CA SERVER offers, if it hashes to EXPECTED_HASH."""
    address = check_address(server)
    anything = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anything.check_hostname = False
    anything.verify_mode = ssl.CERT_NONE
    status, answer = _call(anything, address, "GET", None)
    if status != 200 or not isinstance(answer.get("ca_certificate"), str):
        raise EnrollError(f"{address} gave no cluster CA (HTTP {status}); is it a server?")
    pem = answer["ca_certificate"].encode()
    try:
        ca = certs.cert_from_pem(pem)
    except ValueError:
        raise EnrollError(f"{address} gave an unreadable CA certificate") from None
    presented = certs.ca_hash(ca)
    if presented != expected_hash:
        raise EnrollError(
            f"CA hash mismatch: {address} presented {presented}, expected {expected_hash}; "
            "check the server address and the hash the admin gave you"
        )
    return Pinned(address, certs.identity_of(ca).cluster, presented, certs.cert_to_pem(ca))


@dataclass(frozen=True)
class Enrolled:
    context: Context
    answer: dict[str, Any]


def enroll(
    pinned: Pinned, code: str, web_password: str | None, operator_dir: Path | None
) -> Enrolled:
    """Trade CODE for a certificate of a key made here, and write the context."""
    directory = (operator_dir or config_home() / pinned.cluster).expanduser().absolute()
    if (directory / "context.json").exists():
        raise EnrollError(
            f"{directory} holds a context already; give --operator-dir DIR for this one"
        )
    key = certs.new_private_key()
    # The cluster names the certificate after the person the code was made for.
    csr = certs.make_csr(key, "enrolling").public_bytes(serialization.Encoding.PEM)
    verified = ssl.create_default_context(cadata=pinned.ca_pem.decode())
    verified.check_hostname = False  # the CA pin and the server role stand in for it
    body = {"code": code, "csr": csr.decode(), "web_password": web_password}
    status, answer = _call(verified, pinned.server, "POST", body, cluster=pinned.cluster)
    if status != 200:
        raise EnrollError(str(answer.get("error") or f"{pinned.server} answered HTTP {status}"))
    cert_pem = str(answer["certificate"]).encode()
    cert = certs.cert_from_pem(cert_pem)
    _check_certificate(cert, key, pinned)
    context = Context(
        directory=directory,
        cluster=pinned.cluster,
        operator=str(answer["name"]),
        servers=(pinned.server,),
        ca_hash=pinned.ca_hash,
    )
    context.write_credentials(
        ca_pem=pinned.ca_pem, cert_pem=cert_pem, key_pem=certs.key_to_pem(key)
    )
    return Enrolled(context, answer)


def _check_certificate(
    cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, pinned: Pinned
) -> None:
    identity = certs.identity_of(cert)
    mine = cert.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    if not mine or identity.role != certs.Role.OPERATOR or identity.cluster != pinned.cluster:
        raise EnrollError("the cluster answered with a certificate that is not for this key")


def _call(
    context: ssl.SSLContext,
    server: str,
    method: str,
    body: dict[str, Any] | None,
    *,
    cluster: str | None = None,
) -> tuple[int, dict[str, Any]]:
    host, _, port = server.rpartition(":")
    # As every client of ours: the name that gets the cluster's certificate, not the web
    # UI's (oz0/server/tls.py), which the pinned CA would not verify.
    conn = connection(host.strip("[]"), int(port), context, timeout=TIMEOUT)
    try:
        conn.connect()
        if cluster is not None:
            _check_server(conn, cluster)
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, PATH, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read(1 << 20)
    except ssl.SSLError as e:
        raise EnrollError(f"{server}: TLS refused ({e.reason or e})") from None
    except (OSError, http.client.HTTPException) as e:
        raise EnrollError(f"{server}: {getattr(e, 'strerror', None) or e}") from None
    finally:
        conn.close()
    try:
        decoded = json.loads(data) if data else {}
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise EnrollError(f"{server} answered HTTP {response.status} without a JSON object")
    return response.status, decoded


def _check_server(conn: http.client.HTTPSConnection, cluster: str) -> None:
    sock = conn.sock
    der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
    identity = certs.identity_of_der(der) if der else None
    if identity is None or identity.role != certs.Role.SERVER or identity.cluster != cluster:
        raise EnrollError(f"{conn.host} presented no server certificate of cluster {cluster}")
