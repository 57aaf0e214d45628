"""Calls to the management API with the context's operator certificate."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import ssl
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

from cryptography import x509

from oz0 import pki
from oz0.context import Context
from oz0.errors import Oz0Error

EXPIRY_WARNING = dt.timedelta(days=15)
TIMEOUT = 15.0


class ApiError(Oz0Error):
    pass


def expiry_warning(not_after: dt.datetime, now: dt.datetime) -> str | None:
    left = not_after - now
    if left <= dt.timedelta(0):
        return None  # expired: the refusal says so
    if left < EXPIRY_WARNING:
        return (
            f"warning: operator certificate expires in {left.days} days ({not_after:%Y-%m-%d}); "
            "run `orchestrator-zero operator renew`"
        )
    return None


class ApiClient:
    def __init__(self, context: Context, *, now: Callable[[], dt.datetime] = pki.utcnow) -> None:
        self.context = context
        try:
            cert = pki.cert_from_pem(context.cert_path.read_bytes())
        except (OSError, ValueError) as e:
            raise Oz0Error(f"cannot read operator certificate {context.cert_path}: {e}") from None
        current = now()
        if cert.not_valid_after_utc <= current:
            raise Oz0Error(
                f"operator certificate {context.cert_path} expired on "
                f"{cert.not_valid_after_utc:%Y-%m-%d}; get a new one on a server's machine with "
                "`orchestrator-zero server operator issue`"
            )
        warning = expiry_warning(cert.not_valid_after_utc, current)
        if warning:
            print(warning, file=sys.stderr)
        # Any certificate the cluster CA gave a server is a server of this cluster, whatever
        # address reached it (a context may name 127.0.0.1 or a load balancer): the CA pin
        # and the role in the certificate stand in for the host name check.
        self._ssl = ssl.create_default_context(cafile=str(context.ca_path))
        self._ssl.check_hostname = False
        self._ssl.load_cert_chain(str(context.cert_path), str(context.key_path))

    def get(self, path: str, query: dict[str, Any] | None = None) -> Any:
        if query:
            cleaned = {k: v for k, v in query.items() if v is not None}
            if cleaned:
                path = f"{path}?{urllib.parse.urlencode(cleaned)}"
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Try each server of the context in turn until one answers.

        A change (anything but GET) goes to the next server only if the last one never got
        it: once sent, a lost answer may hide a change that was made, and doing it again
        could make a second token or renew twice.
        """
        failures = []
        for server in self.context.servers:
            sent = False
            host, _, port = server.rpartition(":")
            conn = http.client.HTTPSConnection(
                host.strip("[]"), int(port), context=self._ssl, timeout=TIMEOUT
            )
            try:
                payload = json.dumps(body).encode() if body is not None else None
                headers = {"Content-Type": "application/json"} if payload else {}
                conn.connect()
                _check_server_role(conn, self.context.cluster)
                conn.request(method, path, body=payload, headers=headers)
                sent = True
                response = conn.getresponse()
                data = response.read()
            except ssl.SSLError as e:
                failures.append(f"{server}: TLS refused ({e.reason or e})")
                _unless_maybe_done(method, sent, failures)
                continue
            except http.client.RemoteDisconnected:
                # With TLS 1.3 a refused client certificate shows only at the first read.
                failures.append(
                    f"{server}: closed the connection without answering "
                    "(is the operator certificate from this cluster and still valid?)"
                )
                _unless_maybe_done(method, sent, failures)
                continue
            except (TimeoutError, OSError, http.client.HTTPException) as e:
                failures.append(f"{server}: {getattr(e, 'strerror', None) or e}")
                _unless_maybe_done(method, sent, failures)
                continue
            finally:
                conn.close()
            try:
                decoded = json.loads(data) if data else {}
            except ValueError:
                raise ApiError(f"{server} answered HTTP {response.status} without JSON") from None
            if response.status >= 400:
                message = decoded.get("error") if isinstance(decoded, dict) else None
                raise ApiError(message or f"{server} answered HTTP {response.status}")
            return decoded
        raise ApiError("no server of the context answered: " + "; ".join(failures))


def _unless_maybe_done(method: str, sent: bool, failures: list[str]) -> None:
    """Stop trying other servers when the change may have been made by this one."""
    if sent and method != "GET":
        raise ApiError(
            f"{failures[-1]}; the request was sent, so it may have been carried out: "
            "check (e.g. with the matching list command or `audit list`) before trying again"
        )


def _check_server_role(conn: http.client.HTTPSConnection, cluster: str) -> None:
    sock = conn.sock
    der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
    identity = pki.identity_of(x509.load_der_x509_certificate(der)) if der else None
    if identity is None or identity.role != pki.Role.SERVER or identity.cluster != cluster:
        raise ssl.SSLError("the peer's certificate is not a server certificate of this cluster")
