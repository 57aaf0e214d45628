"""Calls to the management API with the context's operator certificate."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import select
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from oz0.context import Context, ContextError, check_address
from oz0.errors import Oz0Error
from oz0_common import certs

EXPIRY_WARNING = dt.timedelta(days=15)
# Each read of an answer; a long-running call answers within it (a long poll of a job's
# output gives its read this beyond the wait it asks the server for: `read_timeout`).
TIMEOUT = 15.0
# Reaching one server (TCP and TLS; the server allows a handshake as long): past it the next
# server of the context is tried.
CONNECT_TIMEOUT = 10.0
# The context's list of servers up is asked for again after this, or when one did not answer.
REFRESH_AFTER = dt.timedelta(seconds=60)
CLUSTER_PATH = "/api/v1/cluster"
# A connection that answered is used again for the command's next request (the server keeps
# an idle one 10 s); one idle longer than this is closed rather than risked.
KEEP_IDLE = 5.0


class ApiError(Oz0Error):
    pass


class StreamRefused(ApiError):
    """A server answered a stream's request with an error: its one line, and STATUS."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(ApiError):
    """A server could not be reached, or gave no answer (the reason in one line)."""


class Stream:
    """An answer read a line at a time as the server sends it (`ApiClient.open_stream`);
    each read waits at most the read timeout it was opened with (TimeoutError past it)."""

    def __init__(self, conn: http.client.HTTPSConnection, answer: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._answer = answer

    def readline(self, limit: int) -> bytes:
        """The next line, with its newline; without one: the stream ended (or the line
        was longer than LIMIT)."""
        return self._answer.readline(limit)

    def close(self) -> None:
        self._answer.close()
        self._conn.close()


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
    def __init__(
        self,
        context: Context,
        *,
        now: Callable[[], dt.datetime] = certs.utcnow,
        learn_servers: bool = True,
    ) -> None:
        self.context = context
        self._now = now
        # Once per command at most; never for one whose certificate is void once it is done.
        self._refreshed = not learn_servers
        try:
            cert = certs.cert_from_pem(context.cert_path.read_bytes())
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
        # Connections that answered and may be used again, and the TLS session each server
        # gave last (a new connection to it resumes that session: no full handshake).
        # Shared by the threads of one client (the benchmarks use several).
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[_Connection, float]]] = {}
        self._sessions: dict[str, ssl.SSLSession] = {}

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn, _ in conns:
                conn.close()

    def __del__(self) -> None:
        if hasattr(self, "_idle"):
            self.close()

    def get(
        self, path: str, query: dict[str, Any] | None = None, *, read_timeout: float = TIMEOUT
    ) -> Any:
        if query:
            cleaned = {k: v for k, v in query.items() if v is not None}
            if cleaned:
                path = f"{path}?{urllib.parse.urlencode(cleaned)}"
        return self.request("GET", path, read_timeout=read_timeout)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        read_timeout: float = TIMEOUT,
    ) -> Any:
        """Try each server of the context in turn until one answers.

        A change (anything but GET) goes to the next server only if the last one never got
        it: once sent, a lost answer may hide a change that was made, and doing it again
        could make a second token or renew twice.
        """
        failures: list[str] = []
        for server in self.context.addresses:
            try:
                status, decoded = self._exchange(server, method, path, body, read_timeout)
            except _Unanswered as e:
                failures.append(f"{server}: {e.reason}")
                _unless_maybe_done(method, e.sent, failures)
                continue
            if status >= 400:
                message = decoded.get("error") if isinstance(decoded, dict) else None
                raise ApiError(message or f"{server} answered HTTP {status}")
            cluster = decoded if (method, path) == ("GET", CLUSTER_PATH) else None
            self._refresh(server, stale=bool(failures), cluster=cluster)
            return decoded
        raise ApiError("no server of the context answered: " + "; ".join(failures))

    def open_stream(self, server: str, path: str, *, read_timeout: float) -> Stream:
        """GET PATH of SERVER as a stream (an answer that goes on): StreamRefused when it
        answers with an error, Unreachable when it cannot be reached or does not answer
        (each wait bounded: CONNECT_TIMEOUT, then READ_TIMEOUT a read)."""
        conn = self._new(server)
        try:
            conn.connect()
            conn.sock.settimeout(TIMEOUT)
            _check_server_role(conn, self.context.cluster)
            conn.sock.settimeout(read_timeout)
            conn.request("GET", path)
            answer = conn.getresponse()
            if answer.status < 400:
                self._refresh(server, stale=False, cluster=None)
                return Stream(conn, answer)
            data = answer.read(64 * 1024)
        except ssl.SSLError as e:
            conn.close()
            raise Unreachable(f"{server}: TLS refused ({e.reason or e})") from None
        except http.client.RemoteDisconnected:
            conn.close()
            raise Unreachable(
                f"{server}: closed the connection without answering (is the operator"
                " certificate from this cluster and still valid?)"
            ) from None
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            conn.close()
            raise Unreachable(f"{server}: {getattr(e, 'strerror', None) or e}") from None
        conn.close()
        try:
            decoded = json.loads(data)
        except ValueError:
            decoded = None
        message = decoded.get("error") if isinstance(decoded, dict) else None
        raise StreamRefused(message or f"{server} answered HTTP {answer.status}", answer.status)

    def _exchange(
        self,
        server: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        read_timeout: float = TIMEOUT,
    ) -> tuple[int, Any]:
        """One request to SERVER: its status and decoded JSON, or _Unanswered.

        On a connection kept from an earlier request if there is one; should that one fail,
        the request goes on a new connection if it was not sent yet, or is a GET.
        """
        conn = self._take(server)
        if conn is not None:
            try:
                return self._exchange_on(
                    conn, server, method, path, body, fresh=False, read_timeout=read_timeout
                )
            except _Unanswered as e:
                if e.sent and method != "GET":
                    raise
        return self._exchange_on(
            self._new(server), server, method, path, body, fresh=True, read_timeout=read_timeout
        )

    def _exchange_on(
        self,
        conn: _Connection,
        server: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        fresh: bool,
        read_timeout: float = TIMEOUT,
    ) -> tuple[int, Any]:
        sent = False
        keep = False
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload else {}
            if fresh:
                # A server that is down costs CONNECT_TIMEOUT at most (connection and TLS
                # handshake); one that answers gets READ_TIMEOUT (TIMEOUT unless asked) for each
                # read of its answer.
                conn.connect()
                conn.sock.settimeout(TIMEOUT)
                _check_server_role(conn, self.context.cluster)
            # Set for each request: a kept connection may come from a long poll's.
            conn.sock.settimeout(read_timeout)
            conn.request(method, path, body=payload, headers=headers)
            sent = True
            response = conn.getresponse()
            data = response.read()
            keep = not response.will_close
        except ssl.SSLError as e:
            raise _Unanswered(f"TLS refused ({e.reason or e})", sent) from None
        except http.client.RemoteDisconnected:
            # With TLS 1.3 a refused client certificate shows only at the first read.
            raise _Unanswered(
                "closed the connection without answering "
                "(is the operator certificate from this cluster and still valid?)",
                sent,
            ) from None
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            raise _Unanswered(str(getattr(e, "strerror", None) or e), sent) from None
        finally:
            if keep:
                self._give_back(server, conn)
            else:
                conn.close()
        try:
            return response.status, json.loads(data) if data else {}
        except ValueError:
            raise ApiError(f"{server} answered HTTP {response.status} without JSON") from None

    def _new(self, server: str) -> _Connection:
        host, _, port = server.rpartition(":")
        with self._lock:
            session = self._sessions.get(server)
        return _Connection(
            host.strip("[]"), int(port), self._ssl, timeout=CONNECT_TIMEOUT, session=session
        )

    def _take(self, server: str) -> _Connection | None:
        """An idle connection to SERVER that is still open, if there is one."""
        now = time.monotonic()
        while True:
            with self._lock:
                conns = self._idle.get(server)
                if not conns:
                    return None
                conn, since = conns.pop()
            if now - since < KEEP_IDLE and not _closed_by_peer(conn):
                return conn
            conn.close()

    def _give_back(self, server: str, conn: _Connection) -> None:
        sock = conn.sock
        session = sock.session if isinstance(sock, ssl.SSLSocket) else None
        with self._lock:
            if session is not None:
                self._sessions[server] = session
            self._idle.setdefault(server, []).append((conn, time.monotonic()))

    def _refresh(self, server: str, *, stale: bool, cluster: Any) -> None:
        """Learn the servers that are up from SERVER, which just answered, and keep them in
        the context: when it has never learned them, when they are older than
        REFRESH_AFTER, or when one of them did not answer (STALE). Best effort: a context
        that cannot be updated still works with what it holds."""
        if self._refreshed:
            return
        self._refreshed = True
        now = self._now()
        learned_at = self.context.learned_at
        if not stale and learned_at is not None and now - REFRESH_AFTER < learned_at <= now:
            return
        if cluster is None:
            try:
                status, cluster = self._exchange(server, "GET", CLUSTER_PATH, None)
            except (_Unanswered, ApiError):
                return
            if status != 200:
                return
        learned = servers_of(cluster)
        if not learned:
            return
        try:
            # Read again: another command may have rewritten the file meanwhile.
            current = Context.load(self.context.path)
            if current.cluster != self.context.cluster:
                return
            updated = current.with_learned(learned, now)
            if updated.to_json() != current.to_json():
                updated.save()
        except (ContextError, OSError):
            return
        self.context = updated


def servers_of(cluster: Any) -> tuple[str, ...]:
    """The management addresses of the servers up, from GET /api/v1/cluster's answer."""
    if not isinstance(cluster, dict) or not isinstance(cluster.get("servers"), list):
        return ()
    found: list[str] = []
    for row in cluster["servers"]:
        advertise = row.get("advertise") if isinstance(row, dict) else None
        if not isinstance(advertise, str):
            continue
        try:
            address = check_address(advertise)
        except ContextError:
            continue
        if address not in found:
            found.append(address)
    return tuple(found)


def connection(
    host: str, port: int, context: ssl.SSLContext, *, timeout: float
) -> http.client.HTTPSConnection:
    """An HTTPS connection to a server's management API as the CLI makes them (for scripts
    and tests with an SSL context of their own)."""
    return _Connection(host, port, context, timeout=timeout, session=None)


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection that offers a TLS session to resume (http.client has no way) and
    sends the server name of our own clients."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        timeout: float,
        session: ssl.SSLSession | None,
    ) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self._tls = context
        self._session = session

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        # The name that gets the server's cluster-CA certificate, not the web UI's
        # (oz0/server/tls.py); the host name is not checked anyway (see ApiClient).
        self.sock = self._tls.wrap_socket(
            self.sock, server_hostname=certs.API_SERVER_NAME, session=self._session
        )


def _closed_by_peer(conn: _Connection) -> bool:
    """Whether an idle connection has something to read: the server closed it (an idle
    connection is sent nothing else)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class _Unanswered(Exception):
    """A server gave no answer; SENT says whether it may have received the request."""

    def __init__(self, reason: str, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


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
    identity = certs.identity_of_der(der) if der else None
    if identity is None or identity.role != certs.Role.SERVER or identity.cluster != cluster:
        raise ssl.SSLError("the peer's certificate is not a server certificate of this cluster")
