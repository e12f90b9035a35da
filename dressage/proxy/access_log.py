"""The proxy's access log: one line per HTTP request, on logger ``dressage.proxy.access``.

    app.add_middleware(AccessLog)      # create_app does this with --access-log

A line reads::

    POST /sessions/{session_id}/v1/chat/completions session=s-7 status=400 ms=3.1 refused=top_p

method, the route's template (never the raw path, so no id is logged twice and no key that a
client put in a query string is logged), the session (the path's id, else the
``X-Session-Id`` header), the status sent, the time to the end of the answer in milliseconds,
and on a 4xx the field the request was refused for (the ``param`` of the error body) and the
error's code. It carries no message content and no key. The log is off by default (a line
costs about 3% of a call's CPU, docs/proxy-performance.md) and on with ``--access-log``; its lines
are at INFO, and ``dressage-proxy`` then keeps this logger at INFO whatever ``--log-level`` says. A
streamed answer is logged when its stream ends (its status is 200 even when an error travels
in the stream: the error is logged by the chat route).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ACCESS_LOGGER", "AccessEntry", "AccessLog", "note_refusal"]

ACCESS_LOGGER = "dressage.proxy.access"
log = logging.getLogger(ACCESS_LOGGER)
_SCOPE_KEY = "dressage.access"
_SESSION_HEADERS = (b"x-session-id", b"x-dressage-session-id")


@dataclass
class AccessEntry:
    """What the error handler adds to a request's line: the refused field and the code."""

    refused: str | None = None
    code: str | None = None


def note_refusal(scope: Scope, param: str | None, code: str | None) -> None:
    """Called by the proxy's error handler: the request's line names ``param`` and ``code``."""
    entry = scope.get(_SCOPE_KEY)
    if isinstance(entry, AccessEntry):
        entry.refused, entry.code = param, code


def _session(scope: Scope) -> str:
    session = (scope.get("path_params") or {}).get("session_id")
    if session:
        return str(session)[:128]
    for name, value in scope.get("headers") or ():
        if name in _SESSION_HEADERS:
            return value.decode("latin-1")[:128]
    return "-"


def _route(scope: Scope) -> str:
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "(no route)"


class AccessLog:
    """ASGI middleware writing one access line per HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before it answers
        entry = AccessEntry()
        scope[_SCOPE_KEY] = entry

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            ms = (time.perf_counter() - started) * 1000.0
            line = f"{scope['method']} {_route(scope)} session={_session(scope)} status={status}"
            line += f" ms={ms:.1f}"
            if 400 <= status < 500:
                line += f" refused={entry.refused or '-'}"
                if entry.code:
                    line += f" code={entry.code}"
            log.info(line)
