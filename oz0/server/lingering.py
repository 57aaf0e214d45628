"""An answer given before its request's body has all come in (a 413 for a body over the
limit, a 401 or 404 that never read it) is followed by reading the rest of that body, within
bounds, before the exchange ends: the lingering close of RFC 9112, section 9.6 (nginx's
`lingering_close`).

Hypercorn closes a connection as soon as an answer is sent while the request's body is
still arriving. The unread bytes in the socket make the kernel reset the connection, and
the reset can reach the client before it has read the answer: curl then reports a send
failure (exit 55) instead of the 413 and its reason, and our CLI a reset connection. Here
the answer goes out whole at once, the rest of the body is read and dropped for at most
LINGER_BYTES or LINGER_TIME, and only then does the exchange end (and hypercorn close).
"""

from __future__ import annotations

from typing import cast

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPResponseBodyEvent,
    Scope,
)

# What is read and dropped after an early answer at most: a few times the largest body a
# route takes (management.UPLOAD_BODY_SIZE, base64 in JSON), and for at most this long.
LINGER_BYTES = 8 * 1024 * 1024
LINGER_TIME = 2.0


class _Body:
    """The request's receive, noting when its body has all come in (or the client left)."""

    def __init__(self, receive: ASGIReceiveCallable) -> None:
        self._receive = receive
        self.complete = False

    async def receive(self) -> ASGIReceiveEvent:
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self.complete = True
        return message

    async def drain(self) -> None:
        read = 0
        with trio.move_on_after(LINGER_TIME):
            while not self.complete and read <= LINGER_BYTES:
                read += len(cast(bytes, (await self.receive()).get("body", b"")))


class LingeringClose:
    """APP, whose answers given before the request's body came in end only once the rest
    of the body is read (see the module's docstring). Other scopes pass through."""

    def __init__(self, app: ASGIFramework) -> None:
        self._app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        body = _Body(receive)
        held = False

        async def send_but_the_end(message: ASGISendEvent) -> None:
            nonlocal held
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if last and not body.complete:
                held = True  # the answer goes out now; its end, after the drain
                if message.get("body"):
                    await send(cast(HTTPResponseBodyEvent, {**message, "more_body": True}))
                return
            await send(message)

        await self._app(scope, body.receive, send_but_the_end)
        if held:
            await body.drain()
            end: HTTPResponseBodyEvent = {
                "type": "http.response.body",
                "body": b"",
                "more_body": False,
            }
            await send(end)
