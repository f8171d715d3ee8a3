"""What the server asks of a client's connection, below the app. uvicorn bounds neither the size of
a request's head (its line and headers) nor the time the head or the body takes to arrive (its
keep-alive timeout runs only between requests), so a slow, dead or hostile client (slowloris) could
hold a connection, its memory and a request slot for ever. Here:

- the head must fit in ``max_head_bytes``: more is answered 431;
- the head must arrive whole within ``head_timeout_s`` of its first byte (a new connection's clock
  starts when it opens): later is answered 408, or, if the connection sent nothing, closed;
- the body must not pause for longer than ``body_timeout_s`` while the app waits for it: 408.

Each closes the connection. :class:`GuardedHttp` is uvicorn's HTTP/1.1 protocol (httptools) with the
head's bounds; :class:`BodyTimeout` is ASGI middleware, so that only the time the app spends waiting
for bytes counts (not the time a pipelined request waits for its turn).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from scratchformer.serve.config import Limits
from scratchformer.serve.errors import error_body

__all__ = ["BodyTimeout", "GuardedHttp"]


LINGER_S = 2.0  # after a refusal, how long the client's further bytes are read and dropped


class HeadTooLarge(Exception):
    """Raised in a parser callback: httptools stops, and uvicorn answers with ``send_400_response``."""


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the head's size and arrival time bounded by ``limits``.
    ``head_size`` is the head's request line and headers as parsed; ``head_bytes`` what arrived since
    the last request ended, which bounds a head still incomplete (None once a head is complete)."""

    def __init__(self, *args: Any, limits: Limits, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.head_size, self.head_bytes = 0, 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # dropped until the connection closes
        if self.head_bytes is not None:
            self.head_bytes += len(data)
        super().data_received(data)
        if self.head_bytes is not None and self.head_bytes > self.limits.max_head_bytes:
            self._refuse_large_head()

    def send_400_response(self, msg: str) -> None:
        if self.head_size > self.limits.max_head_bytes:
            self._refuse_large_head()
        else:
            super().send_400_response(msg)

    # httptools' callbacks, as the parser reads a request

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_size = 0
        if self.head_timer is None:
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self.head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.head_size += len(name) + len(value) + 4  # name: value CRLF

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self.head_bytes = None
        if self.head_size > self.limits.max_head_bytes:
            raise HeadTooLarge
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.head_bytes = 0

    # the head's clock

    def _start_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_too_slow)

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_too_slow(self) -> None:
        self.head_timer = None
        if self.flow.read_paused:  # the server is not reading (a pipelined request waits): not late
            self._start_head_timer()
        elif self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # answer the request in flight, then close
        elif self.head_bytes:
            seconds = self.limits.head_timeout_s
            self._refuse(408, f"the request's head did not arrive within head_timeout_s={seconds}")
        else:
            self.transport.close()  # a connection that never sent a byte: no answer is expected

    # refusals

    def _refuse_large_head(self) -> None:
        limit = self.limits.max_head_bytes
        self._refuse(431, f"the request's head is over max_head_bytes={limit}")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with the server's one-line JSON error and close the connection: first
        our side, then, after the client's further bytes were read and dropped for up to
        ``LINGER_S``, all of it (closed with bytes unread, it would reset before the answer is read)."""
        if self.refused or self.transport.is_closing():
            return
        self.refused = True
        self._stop_head_timer()
        body = json.dumps(error_body(status, message)).encode()
        head = [STATUS_LINE[status]]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body)]
        self.transport.write(b"".join([*head, b"connection: close\r\n\r\n", body]))
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


class BodyTimeout:
    """ASGI middleware: while the app waits for a request's body, each piece must come within
    ``seconds``; if one does not, the app is told the client left (``http.disconnect``), the client
    is answered 408 (unless the app answered already) and the connection is closed."""

    def __init__(self, app: Any, seconds: float):
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_done, timed_out, started = False, False, False

        async def receive_in_time() -> dict:
            nonlocal body_done, timed_out
            if body_done:  # later calls wait for the disconnect, as long as it takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.seconds)
            except asyncio.TimeoutError:
                timed_out = body_done = True
                return {"type": "http.disconnect"}
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_closing_if_late(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if timed_out:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive_in_time, send_closing_if_late)
        if timed_out and not started:
            error = f"the request's body stopped arriving for body_timeout_s={self.seconds}"
            await _send_json(send, 408, error_body(408, error))


async def _send_json(send: Any, status: int, body: dict) -> None:
    content = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
