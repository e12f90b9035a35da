"""How the proxy is served: uvicorn's settings, shared by ``dressage-proxy`` and the tests.

    server = uvicorn.Server(uvicorn_config(app, log_level="warning"))

Two settings differ from uvicorn's defaults, each for a failure seen under load:

- ``timeout_keep_alive`` (:data:`KEEP_ALIVE_S`). uvicorn closes a connection idle for 5 s, and
  the OpenAI SDK's httpx pool reuses a connection idle for up to 5 s (``keepalive_expiry``).
  The two clocks start a transit apart, so a call that reuses a connection at ~5 s idle meets a
  server that has just closed it: the client gets ``ReadError`` (about 1 call in 1,000 with 256
  sessions whose calls come ~5 s apart). The server must be the side that waits longer: it keeps
  idle connections well past any common client's pool expiry (httpx 5 s, aiohttp 15 s), so the
  client always closes first. Idle connections cost one socket each.
- the HTTP protocol tells a request's handler when the client hangs up, by a callback: the ASGI
  way is a task per request that waits on ``receive()`` for ``http.disconnect``. The scope's
  ``extensions`` carry a list under :data:`DISCONNECT_HOOKS`; the protocol calls each callable
  in it when the connection closes before that request's response is complete
  (:class:`~dressage.proxy.chat_routes.ClientWatch` uses it, and the ``receive()`` wait where
  the list is absent: another server, a test client).
- the HTTP protocol answers a request it cannot parse with the proxy's JSON error body instead of
  uvicorn's plain text, and says why when it knows (a URL longer than the parser's 65,535
  bytes, e.g. a 100,000-character session id in the path).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import uvicorn

from dressage.proxy.errors import error_body
from dressage.proxy.openai_api import dumps

__all__ = [
    "DISCONNECT_HOOKS",
    "KEEP_ALIVE_S",
    "MAX_URL_BYTES",
    "http_protocol",
    "uvicorn_config",
]

KEEP_ALIVE_S = 75
"""Seconds an idle client connection stays open (see the module docstring)."""
MAX_URL_BYTES = 65535
"""Longest request target the HTTP parser (httptools) accepts."""
DISCONNECT_HOOKS = "dressage.disconnect"
"""The key, in a request scope's ``extensions``, of the callables the server calls when the
client hangs up before the response is complete (see the module docstring)."""


def _bad_request_body(reason: str) -> bytes:
    return dumps(
        error_body(
            f"invalid HTTP request: {reason}", "invalid_request_error", code="invalid_http_request"
        )
    )


def _load_protocols() -> tuple[type[Any], ...]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JSONErrorsH11(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            import h11

            body = _bad_request_body(msg.rstrip("."))
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            event = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            for out in (event, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(out))
            self.transport.close()

    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: uvicorn serves with h11
        return (JSONErrorsH11,)

    class JSONErrorsHttpTools(HttpToolsProtocol):
        _why: str | None = None
        _in_flight: list[tuple[Any, list[Callable[[], None]]]] | None = None
        """This connection's requests not answered yet, with their disconnect hooks."""

        def on_headers_complete(self) -> None:
            if len(self.url) > MAX_URL_BYTES:  # httptools.parse_url refuses it just below
                self._why = (
                    f"the URL is {len(self.url)} bytes long, over the limit of {MAX_URL_BYTES} "
                    "(session ids are 1-128 characters)"
                )
            hooks: list[Callable[[], None]] = []
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[DISCONNECT_HOOKS] = hooks
            super().on_headers_complete()
            cycle: Any = self.cycle  # its send is replaced below
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade
                kept = [p for p in self._in_flight or () if not p[0].response_complete]
                kept.append((cycle, hooks))
                self._in_flight = kept
                if self.scope["method"] != "HEAD":  # uvicorn writes no body for a HEAD
                    cycle.send = _one_write(cycle)

        def connection_lost(self, exc: Exception | None) -> None:
            in_flight, self._in_flight = self._in_flight or [], None
            super().connection_lost(exc)
            for cycle, hooks in in_flight:
                if not cycle.response_complete:
                    for hook in hooks:
                        hook()

        def send_400_response(self, msg: str) -> None:
            body = _bad_request_body(self._why or msg.rstrip("."))
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
            )
            self.transport.close()

    return (JSONErrorsHttpTools, JSONErrorsH11)


class _Held:
    """A transport that keeps what is written to it, for :func:`_one_write`."""

    __slots__ = ("parts", "transport")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self.transport, name)

    def flush(self) -> None:
        parts, self.parts = self.parts, []
        if parts and not self.transport.is_closing():
            self.transport.write(b"".join(parts))

    def close(self) -> None:  # uvicorn closes after the last body part when not keep-alive
        self.flush()
        self.transport.close()


def _sized(message: Any) -> bool:
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


def _one_write(cycle: Any) -> Callable[[Any], Any]:
    """``cycle.send`` for which a whole answer (one with a Content-Length) leaves in one write:
    uvicorn writes the status line and headers when the answer starts, then the body, two
    system calls where one does. The head is held until the body's first part. A streamed
    answer (no Content-Length) is written as it comes: its head goes out at once. It holds
    the cycle by a weak reference and uvicorn's send as a plain function: the cycle holds it,
    and a reference back would leave a cycle of garbage per request."""
    owner = weakref.ref(cycle)
    uvicorn_send = type(cycle).send
    held: _Held | None = None

    async def send_in_one_write(message: Any) -> None:
        nonlocal held
        cycle = owner()
        if cycle is None:  # never while its request runs: uvicorn's task holds the cycle
            return
        if held is not None:  # the body after a held head
            pending, held = held, None
            try:
                await uvicorn_send(cycle, message)
            finally:
                cycle.transport = pending.transport
                pending.flush()
            return
        if message["type"] != "http.response.start" or not _sized(message):
            await uvicorn_send(cycle, message)
            return
        held = _Held(cycle.transport)
        cycle.transport = held
        try:
            await uvicorn_send(cycle, message)
        except BaseException:
            cycle.transport, held = held.transport, None
            raise

    return send_in_one_write


def http_protocol() -> type[Any]:
    """uvicorn's HTTP protocol (httptools when installed, else h11) with JSON 400 answers."""
    return _load_protocols()[0]


def uvicorn_config(app: Any, *, log_level: str = "warning", **options: Any) -> uvicorn.Config:
    """The proxy's uvicorn settings (see the module docstring); ``options`` go to uvicorn."""
    settings: dict[str, Any] = {
        "access_log": False,
        "timeout_graceful_shutdown": 5,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "http": http_protocol(),
    }
    return uvicorn.Config(app, log_level=log_level, **(settings | options))
