"""One edge connection on its own socket: TLS through memory BIOs, websocket frames by wsproto.

Not trio.SSLStream under trio-websocket: at thousands of control streams their layers cost
each message some 300 µs of the one Trio thread (a reader task and a memory channel per
connection, a lock and several checkpoints per send, an SSLStream retry loop per read and
per write), and the streams' own heartbeats saturate the server. Here a message in is one
wait for the socket, one read, one decryption and one parse, in the task that asked for it;
a message out is one encryption and one write, with no await at all while the socket takes
it, so the heartbeat scheduler sends thousands a second without a task switch each. Only
what does not fit in the socket's buffer waits, in `drain`.

Server frames are never masked and no extension is negotiated, so frames out are built
here; what the peer sends (masked frames, fragments, pings, close) is wsproto's to parse.
"""

from __future__ import annotations

import collections
import contextlib
import os
import ssl
import struct

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

READ_SIZE = 64 * 1024
# RFC 6455 close codes.
NORMAL = 1000
PROTOCOL_ERROR = 1002
MESSAGE_TOO_BIG = 1009
# No close frame came: the connection broke (never sent on the wire).
ABNORMAL = 1006


class Closed(Exception):
    """The websocket is closed, or its connection broke; CODE and REASON as it ended."""

    def __init__(self, code: int = ABNORMAL, reason: str | None = None) -> None:
        super().__init__(f"websocket closed ({code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


def text_frame(text: str) -> bytes:
    """TEXT as one unmasked, final text frame (RFC 6455 5.2)."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x81, size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x81, 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 127, size)
    return head + payload


async def tls_handshake(
    transport: trio.abc.Stream,
    context: ssl.SSLContext,
    *,
    threads: trio.CapacityLimiter | None = None,
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """The server side of a TLS handshake over TRANSPORT; its object and BIOs (in, out).

    The handshake goes through TRANSPORT's reads and writes (the edge meters them, see
    handshake_turns.py); what comes after goes straight to the socket (Wire). With
    THREADS, each step on the peer's bytes (its cryptography, about a millisecond, done
    without the interpreter's lock) runs in one of those worker threads, off the thread
    every stream shares.
    """
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    while True:
        if threads is not None and incoming.pending:
            done = await trio.to_thread.run_sync(_handshake_step, tls, limiter=threads)
        else:
            done = _handshake_step(tls)
        if done:
            break
        pending = outgoing.read()
        if pending:
            await transport.send_all(pending)
        received = await transport.receive_some(READ_SIZE)
        if received:
            incoming.write(received)
        else:
            incoming.write_eof()
    pending = outgoing.read()
    if pending:
        await transport.send_all(pending)
    return tls, incoming, outgoing


def _handshake_step(tls: ssl.SSLObject) -> bool:
    """One step of TLS's handshake: whether it is done (else it waits for the peer).

    The wait is an answer here, not an exception: raised in a worker thread, each
    SSLWantReadError came back with a traceback through the thread's frames, a cycle
    left to the garbage collector (about 40 objects a handshake, and thousands of
    handshakes in a reconnect storm: pauses of 50-130 ms)."""
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        return False
    return True


class Wire:
    """A websocket over TLS on the socket of SOCKET_STREAM, its TLS handshake done.

    One task at a time may read (`get_message`); any may send. `abort` closes the socket
    and wakes whoever waits on it.
    """

    def __init__(
        self,
        socket_stream: trio.SocketStream,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        *,
        max_message_size: int,
    ) -> None:
        self._socket = socket_stream.socket
        self._fd = self._socket.fileno()
        self._tls = tls
        self._incoming = incoming
        self._outgoing = outgoing
        self._ws = WSConnection(ConnectionType.SERVER)
        self.max_message_size = max_message_size
        self._unsent = bytearray()
        self._draining = trio.Lock()
        self._messages: collections.deque[str | bytes] = collections.deque()
        self._parts: list[str | bytes | bytearray] = []
        self._part_size = 0
        self._reading = False
        # Set once the connection is over for reading: the peer's close frame, or a break.
        self._ended = trio.Event()
        self._ended_by: Closed | None = None
        self._aborted = False

    def peer_certificate(self) -> bytes | None:
        """The peer's certificate (DER) as TLS verified it, or None if it sent none."""
        return self._tls.getpeercert(binary_form=True)

    @property
    def closed(self) -> Closed | None:
        """How the websocket ended, or None while it is open."""
        return self._ended_by

    # --- the opening handshake ---------------------------------------------------------

    async def accept(self, paths: frozenset[str]) -> str | None:
        """Read the upgrade request; accept it if its path is one of PATHS (the path is
        returned), else answer 404 (None is returned)."""
        while True:
            for event in self._events():
                if isinstance(event, Request):
                    if event.target not in paths:
                        self._write(self._ws.send(RejectConnection(status_code=404)))
                        await self.drain()
                        return None
                    self._write(self._ws.send(AcceptConnection()))
                    await self.drain()
                    return event.target
            await self._receive()

    # --- sending -----------------------------------------------------------------------

    def send_now(self, text: str) -> bool:
        """Send TEXT as a message without waiting: True if the socket took all of it,
        False if some is left for `drain` (it goes out, in order, before anything sent
        after it). Closed if the websocket is closed."""
        return self.send_frame_now(text_frame(text))

    def send_frame_now(self, frame: bytes) -> bool:
        """As `send_now`, for a message already framed (`text_frame`)."""
        if self._ended_by is not None or self._ws.state is not ConnectionState.OPEN:
            raise self._ending(Closed(NORMAL, "closing"))
        self._write(frame)
        return not self._unsent

    async def send_message(self, text: str) -> None:
        if self.send_now(text):
            await trio.lowlevel.checkpoint()
        else:
            await self.drain()

    async def drain(self) -> None:
        """Wait until every byte sent so far is in the socket's buffer."""
        async with self._draining:
            while self._unsent:
                try:
                    await trio.lowlevel.wait_writable(self._socket)
                except (trio.ClosedResourceError, OSError):
                    raise self._break(Closed()) from None
                self._flush()

    def _write(self, plaintext: bytes) -> None:
        """Encrypt PLAINTEXT and write what the socket takes now; the rest waits in order."""
        if self._aborted:
            raise self._ending()
        if plaintext:
            self._tls.write(plaintext)
        self._unsent += self._outgoing.read()
        if not self._draining.locked():
            self._flush()

    def _flush(self) -> None:
        while self._unsent:
            try:
                sent = os.write(self._fd, self._unsent)
            except BlockingIOError:
                return
            except OSError:
                raise self._break(Closed()) from None
            del self._unsent[:sent]

    # --- receiving ---------------------------------------------------------------------

    async def get_message(self) -> str | bytes:
        """The next whole message from the peer; Closed once there is none to come."""
        if self._reading:
            raise trio.BusyResourceError("another task is already reading this websocket")
        self._reading = True
        try:
            waited = False
            while not self._messages:
                if self._ended_by is not None:
                    raise self._ending()
                self._parse()
                if not self._messages and self._ended_by is None:
                    await self._receive()
                    waited = True
            if not waited:
                # What was read earlier is handed over without a wait: still let others run.
                await trio.lowlevel.checkpoint()
            return self._messages.popleft()
        finally:
            self._reading = False

    def _parse(self) -> None:
        """Turn what was received into messages; answer pings and the peer's close."""
        for event in self._events():
            if isinstance(event, TextMessage | BytesMessage):
                self._collect(event)
            elif isinstance(event, Ping):
                self._write(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if self._ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                    # Our answer, or our close after a frame wsproto could not parse.
                    self._write(self._ws.send(CloseConnection(event.code, event.reason)))
                self._end(Closed(event.code, event.reason))
                return

    def _collect(self, event: TextMessage | BytesMessage) -> None:
        self._parts.append(event.data)
        self._part_size += len(event.data)
        if self._part_size > self.max_message_size:
            self._parts.clear()
            reason = f"messages are limited to {self.max_message_size} bytes"
            self._write(self._ws.send(CloseConnection(MESSAGE_TOO_BIG, reason)))
            self._end(Closed(MESSAGE_TOO_BIG, reason))
            return
        if event.message_finished:
            parts, self._parts, self._part_size = self._parts, [], 0
            if isinstance(event, TextMessage):
                self._messages.append("".join(p for p in parts if isinstance(p, str)))
            else:
                data = b"".join(p for p in parts if isinstance(p, bytes | bytearray))
                self._messages.append(data)

    def _events(self) -> list[object]:
        try:
            return list(self._ws.events())
        except RemoteProtocolError as e:
            raise self._refuse(e) from None

    def _refuse(self, error: RemoteProtocolError) -> Closed:
        """The peer broke the protocol: answer what wsproto suggests (a 400 to a bad
        upgrade request), then nothing more is read or sent."""
        if error.event_hint is not None and self._ws.state is ConnectionState.CONNECTING:
            with contextlib.suppress(Closed):
                self._write(self._ws.send(error.event_hint))
        return self._break(Closed(PROTOCOL_ERROR, str(error)))

    async def _receive(self) -> None:
        """Wait for the peer's next bytes and hand what they decrypt to to wsproto."""
        while True:
            try:
                plaintext = self._tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                await self._receive_raw()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                plaintext = b""
            except ssl.SSLError as e:
                raise self._break(Closed(ABNORMAL, f"TLS: {e.reason}")) from None
            if self._outgoing.pending:
                # A TLS message of its own (a key update's answer): out with the rest.
                self._write(b"")
            break
        if not plaintext and self._ws.state is ConnectionState.CONNECTING:
            raise self._break(Closed(ABNORMAL, "closed before its upgrade request"))
        try:
            self._ws.receive_data(plaintext or None)
        except RemoteProtocolError as e:
            raise self._refuse(e) from None

    async def _receive_raw(self) -> None:
        while True:
            if self._aborted:
                raise self._ending()
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(self._socket)
                except trio.ClosedResourceError:
                    raise self._ending() from None
                continue
            except OSError:
                raise self._break(Closed()) from None
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
            return

    # --- closing -----------------------------------------------------------------------

    async def aclose(self, code: int = NORMAL, reason: str | None = None) -> None:
        """Send a close frame and wait for the peer's (as long as the caller lets it),
        then close the socket, even when cancelled."""
        try:
            if self._ws.state is ConnectionState.OPEN and not self._aborted:
                self._write(self._ws.send(CloseConnection(code, reason)))
                await self.drain()
            if self._ended_by is None:
                if self._reading:
                    await self._ended.wait()
                else:
                    await self._read_until_closed()
        except Closed:
            pass
        finally:
            self.abort()

    async def _read_until_closed(self) -> None:
        while self._ended_by is None:
            self._parse()
            self._messages.clear()
            if self._ended_by is None:
                await self._receive()

    def abort(self) -> None:
        """Close the socket now; a task waiting on it wakes with Closed."""
        if not self._aborted:
            self._aborted = True
            self._end(Closed())
            self._socket.close()

    def _end(self, how: Closed) -> None:
        if self._ended_by is None:
            self._ended_by = how
            self._ended.set()

    def _break(self, how: Closed) -> Closed:
        """The connection broke: nothing more can be read or sent."""
        self._end(how)
        self._unsent.clear()
        return self._ending()

    def _ending(self, default: Closed | None = None) -> Closed:
        """A new Closed as the websocket ended (else DEFAULT, else ABNORMAL) to raise.

        The one kept is never raised: its traceback would hold this Wire's frames, a
        cycle that only the garbage collector frees (with the connection's TLS objects
        and buffers: about 80 objects a stream, collected in pauses of tens of ms)."""
        ended = self._ended_by
        if ended is None:
            return default or Closed()
        return Closed(ended.code, ended.reason)
