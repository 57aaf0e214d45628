"""The server side of TLS over a Trio socket, its handshake's cryptography off the Trio thread.

Both listeners (7443 and 8443) run their TLS handshakes through `tls_handshake`: with a
limiter of worker threads, each handshake step on the peer's bytes (about a millisecond of
cryptography, which OpenSSL does without the interpreter's lock) runs in one of those
threads, so the thread every stream and request shares goes on meanwhile, and a burst of
new connections uses the machine's other cores.

`TlsStream` is what the management listener hands hypercorn afterwards: a `trio.abc.Stream`
over the handshaken `ssl.SSLObject`, with one read or write of the socket per call and none
of `trio.SSLStream`'s retry loop (which cost each request's reads and writes more than the
cryptography did).
"""

from __future__ import annotations

import contextlib
import ssl

import trio

READ_SIZE = 64 * 1024


async def tls_handshake(
    transport: trio.abc.Stream,
    context: ssl.SSLContext,
    *,
    threads: trio.CapacityLimiter | None = None,
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """The server side of a TLS handshake over TRANSPORT; its object and BIOs (in, out).

    The handshake goes through TRANSPORT's reads and writes (the edge meters them, see
    edge/handshake_turns.py); what comes after is the caller's. With THREADS, each step on
    the peer's bytes runs in one of those worker threads.
    """
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    while True:
        try:
            if threads is not None and incoming.pending:
                await trio.to_thread.run_sync(tls.do_handshake, limiter=threads)
            else:
                tls.do_handshake()
            break
        except ssl.SSLWantReadError:
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


class TlsStream(trio.abc.Stream):
    """TLS over SOCKET_STREAM, after `tls_handshake`: reads by one task, writes by any.

    As `trio.SSLStream(..., https_compatible=True)`: a peer that closes without TLS's
    close_notify reads as an end of stream, not as an error, and closing sends our
    close_notify without waiting for the peer's.
    """

    def __init__(
        self,
        socket_stream: trio.SocketStream,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
    ) -> None:
        self.transport_stream = socket_stream
        self._tls = tls
        self._incoming = incoming
        self._outgoing = outgoing
        # Records leave in the order they were made: whoever holds the lock sends them all.
        self._sending = trio.Lock()
        self._closed = False

    def getpeercert(self, binary_form: bool = True) -> bytes | None:
        """The peer's certificate (DER) as the handshake verified it, or None."""
        return self._tls.getpeercert(binary_form=True)

    def selected_alpn_protocol(self) -> str | None:
        return self._tls.selected_alpn_protocol()

    async def do_handshake(self) -> None:
        """Done already (`tls_handshake`); hypercorn asks."""
        await trio.lowlevel.checkpoint()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError
        try:
            self._tls.write(data)
        except ssl.SSLError as e:
            raise trio.BrokenResourceError(f"TLS: {e.reason}") from None
        await self._send_records()

    async def _send_records(self) -> None:
        async with self._sending:
            records = self._outgoing.read()
            if records:
                await self.transport_stream.send_all(records)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError
        size = max_bytes or READ_SIZE
        while True:
            try:
                data = self._tls.read(size)
            except ssl.SSLWantReadError:
                received = await self.transport_stream.receive_some(READ_SIZE)
                if received:
                    self._incoming.write(received)
                else:
                    self._incoming.write_eof()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                data = b""
            except ssl.SSLError as e:
                raise trio.BrokenResourceError(f"TLS: {e.reason}") from None
            if self._outgoing.pending:
                # A TLS message of its own (a key update's answer) goes out.
                await self._send_records()
            return data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # Our close_notify is written; the peer's is not awaited.
            with contextlib.suppress(ssl.SSLError):
                self._tls.unwrap()
            await self._send_records()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self.transport_stream.aclose()
