"""The chat routes, and what happens when the agent hangs up in the middle of a call.

    add_chat_routes(app, manager, config, check_key=auth.chat)

``POST /v1/chat/completions`` (session from ``X-Session-Id``) and
``POST /sessions/{session_id}/v1/chat/completions``, plain or streamed (SSE). The work is in
:mod:`~dressage.proxy.sessions`; these handlers read the body, watch the connection and shape
the answer.

A client that gives up (a client timeout, a killed agent) closes its connection. The handler
watches for that (:class:`ClientWatch`, ASGI's ``http.disconnect``) and sets the call's
``client_gone`` event: the engine request is aborted and the session records what it had
generated as an unanswered step. The call still runs to that end, without a reader, for at most
:data:`ABORT_GRACE_S` after the disconnect (an engine that ignores the abort is cancelled then,
and nothing is recorded). A stream keeps being consumed after a disconnect for the same reason,
which is why it is not Starlette's ``StreamingResponse`` (that one cancels the stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from dressage.config.proxy import ProxyConfig
from dressage.proxy.client import PARTIAL_ROLLOUT_HEADER
from dressage.proxy.engine_answers import EngineError
from dressage.proxy.errors import BadRequest, ClientClosedRequest, ProxyError
from dressage.proxy.generation_controller import GoneSignal
from dressage.proxy.http_io import as_proxy_error, json_response, read_json
from dressage.proxy.openai_api import (
    SSE_DONE,
    ChatRequest,
    completion_response,
    dumps,
    parse_chat_request,
    sse_chunk,
    sse_tool_call_deltas,
    usage_block,
)
from dressage.proxy.pause_requests import parse_partial_rollout_header
from dressage.proxy.serving import DISCONNECT_HOOKS
from dressage.proxy.sessions import SessionManager, StreamDelta, StreamEnd, StreamStart
from dressage.proxy.store import StoreError

__all__ = [
    "ABORT_GRACE_S",
    "SESSION_HEADERS",
    "ChatEndpoint",
    "ClientWatch",
    "add_chat_routes",
    "chat_route_session",
]

log = logging.getLogger(__name__)
SESSION_HEADERS = ("x-session-id", "x-dressage-session-id")
ABORT_GRACE_S = 30.0
"""How long a call may run on after its client disconnected (the engine answers an abort in
milliseconds; this only bounds an engine that does not)."""


class ClientWatch:
    """Watches one request's connection; ``gone`` is set when the client disconnects.

    Under the proxy's own server the protocol calls back on a disconnect
    (:data:`~dressage.proxy.serving.DISCONNECT_HOOKS` in the scope): no task per call. Under
    any other server (a test client) a task waits on ``receive()`` for ``http.disconnect``."""

    def __init__(self, receive: Receive, scope: Scope | None = None) -> None:
        self.gone = GoneSignal()
        self._deadline: asyncio.Timeout | None = None
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        hooks = (scope.get("extensions") or {}).get(DISCONNECT_HOOKS) if scope else None
        if isinstance(hooks, list):
            hooks.append(self._disconnected)
        else:
            self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        # After the body, receive() waits until the client disconnects or the response is
        # complete (ASGI servers answer http.disconnect then); after stop(), it is not ours.
        while (await receive())["type"] != "http.disconnect":
            pass
        self._disconnected()

    def _disconnected(self) -> None:
        if self._stopped:
            return
        self.gone.set()
        if self._deadline is not None:
            self._deadline.reschedule(asyncio.get_running_loop().time() + ABORT_GRACE_S)

    @contextmanager
    def bounded(self, deadline: asyncio.Timeout) -> Iterator[None]:
        """Within the block, a disconnect moves ``deadline`` to :data:`ABORT_GRACE_S` later."""
        self._deadline = deadline
        if self.gone.is_set():
            deadline.reschedule(asyncio.get_running_loop().time() + ABORT_GRACE_S)
        try:
            yield
        finally:
            self._deadline = None

    def lost(self) -> None:
        """The server found the connection closed while sending."""
        if not self.gone.is_set():
            self.gone.set()
            if self._deadline is not None:
                self._deadline.reschedule(asyncio.get_running_loop().time() + ABORT_GRACE_S)

    def stop(self) -> None:
        """The call is answered: a disconnect from now on is not its. The watch is not
        cancelled but ends when the server's ``receive()`` says the response is complete: a
        cancelled task leaves a cycle (the task, its ``CancelledError``, the traceback's frames)
        that only the cyclic GC frees, some 20 objects a call."""
        self._stopped = True


def _session_of(request: Request, session_id: str | None) -> str:
    if session_id is None:
        session_id = next(
            (request.headers[h] for h in SESSION_HEADERS if h in request.headers), None
        )
    if not session_id:
        raise BadRequest(
            "no session: use the base URL .../sessions/<session_id>/v1 or send an "
            "X-Session-Id header",
            param="session_id",
            code="missing_session",
        )
    return session_id


def chat_route_session(path: str) -> str | None:
    """Which chat route ``path`` is: ``""`` for ``/v1/chat/completions`` (the session comes in
    a header), the session id of ``/sessions/{session_id}/v1/chat/completions``, None for any
    other path (as Starlette's router matches them: a session id is one path segment)."""
    if path == "/v1/chat/completions":
        return ""
    if path.startswith("/sessions/") and path.endswith("/v1/chat/completions"):
        session_id = path[10:-20]
        if session_id and "/" not in session_id:
            return session_id
    return None


class ChatEndpoint:
    """The ASGI app of both chat routes. The proxy's app calls it before its router and
    middleware (:class:`~dressage.proxy.server.ProxyApp`); the routes registered on the router
    are the same object. It answers its own errors as the app's exception handlers would."""

    def __init__(
        self,
        manager: SessionManager,
        config: ProxyConfig,
        *,
        check_key: Callable[[Request], None],
        error_response: Callable[[Request, Exception], Response],
    ) -> None:
        self.manager, self.config = manager, config
        self.check_key, self.error_response = check_key, error_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        session_id = (scope.get("path_params") or {}).get("session_id")
        try:
            response = await self.chat(request, session_id or None)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, as in the app
            response = self.error_response(request, exc)
        await response(scope, receive, send)

    async def chat(self, request: Request, session_id: str | None) -> Response:
        config, manager = self.config, self.manager
        self.check_key(request)
        session_id = _session_of(request, session_id)
        partial_rollout = parse_partial_rollout_header(request.headers.get(PARTIAL_ROLLOUT_HEADER))
        body = await read_json(request, config.max_request_bytes)
        chat_request = parse_chat_request(body)  # no max_tokens: the session's bounded default
        chat_request.partial_rollout = partial_rollout
        model = chat_request.model or config.served_model_name
        watch = ClientWatch(request.receive, request.scope)
        chat_request.client_gone = watch.gone
        if chat_request.stream:
            return await _stream(manager, session_id, chat_request, model, watch)
        try:
            async with asyncio.timeout(None) as deadline:
                with watch.bounded(deadline):
                    result = await manager.chat(session_id, chat_request)
        except TimeoutError:
            raise ClientClosedRequest(
                f"session {session_id}: the client left and the engine did not end the call "
                f"within {ABORT_GRACE_S} s of the abort; nothing was recorded"
            ) from None
        finally:
            watch.stop()
        usage = usage_block(result.prompt_tokens, result.completion_tokens, result.cached_tokens)
        return json_response(
            completion_response(
                completion_id=result.completion_id,
                model=model,
                message=result.message,
                finish_reason=result.finish_reason,
                usage=usage,
                weight_version=result.weight_version,
                logprobs=result.logprobs,
            )
        )


def add_chat_routes(app: FastAPI, endpoint: ChatEndpoint) -> tuple[Route, Route]:
    """Both chat routes on the router, as ``endpoint`` (an ASGI app: no parameter solving):
    the route by header and the route by path."""
    routes = (
        Route("/v1/chat/completions", endpoint, methods=["POST"]),
        Route("/sessions/{session_id}/v1/chat/completions", endpoint, methods=["POST"]),
    )
    app.router.routes.extend(routes)
    return routes


async def _stream(
    manager: SessionManager,
    session_id: str,
    chat_request: ChatRequest,
    model: str,
    watch: ClientWatch,
) -> Response:
    events = manager.chat_stream(session_id, chat_request)
    try:
        async with asyncio.timeout(None) as deadline:
            with watch.bounded(deadline):
                first = await events.__anext__()
    except BaseException:
        watch.stop()
        await events.aclose()
        raise
    assert isinstance(first, StreamStart)
    include_usage = chat_request.include_usage

    async def sse() -> AsyncIterator[bytes]:
        cid, created = first.completion_id, int(time.time())

        def chunk(
            delta: dict[str, Any],
            finish: str | None = None,
            logprobs: list[dict[str, Any]] | None = None,
        ) -> bytes:
            return sse_chunk(cid, created, model, delta, finish_reason=finish,
                             with_usage_key=include_usage, logprobs=logprobs)  # fmt: skip

        last: list[bytes] = []  # the closing events, sent in one write with [DONE]
        try:
            yield chunk({"role": "assistant", "content": ""})
            async for event in events:
                if isinstance(event, StreamDelta):
                    yield chunk(event.fields, logprobs=event.logprobs)
                elif isinstance(event, StreamEnd):
                    result = event.result
                    rest = event.logprobs  # the tokens no delta carried yet, on the next chunk
                    if event.fields:
                        last.append(chunk(event.fields, logprobs=rest))
                        rest = None
                    for delta in sse_tool_call_deltas(result.message):
                        last.append(chunk(delta, logprobs=rest))
                        rest = None
                    last.append(chunk({}, result.finish_reason, logprobs=rest))
                    if include_usage:
                        usage = usage_block(
                            result.prompt_tokens, result.completion_tokens, result.cached_tokens
                        )
                        last.append(sse_chunk(cid, created, model, None, usage=usage))
        except (ProxyError, EngineError, StoreError) as exc:
            # The HTTP status is sent already: the error travels in the stream (the SDK raises).
            error = as_proxy_error(exc)
            if error.status != ClientClosedRequest.status:
                log.error("session %s: stream failed: %s", session_id, exc)
            last.append(b"data: " + dumps(error.body()) + b"\n\n")
        finally:
            await events.aclose()
        yield b"".join([*last, SSE_DONE])

    return _EventStream(sse(), watch, session_id)


class _EventStream(Response):
    """An SSE response that, unlike Starlette's, reads its events to the end after the client
    left (see the module docstring), within :data:`ABORT_GRACE_S`."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], watch: ClientWatch, session_id: str) -> None:
        # Not Response.__init__: it would render an empty body and its content-length: 0.
        self.status_code = 200
        self.background = None
        self.init_headers()
        self._chunks = chunks
        self._watch = watch
        self._session_id = session_id

    async def _send_chunk(self, send: Send, body: bytes, more: bool) -> None:
        if self._watch.gone.is_set():
            return
        try:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        except OSError:  # ASGI 2.4 servers raise where older ones return silently
            self._watch.lost()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)
            async with asyncio.timeout(None) as deadline:
                with self._watch.bounded(deadline):
                    async for body in self._chunks:
                        await self._send_chunk(send, body, True)
            await self._send_chunk(send, b"", False)
        except TimeoutError:
            log.warning(
                "session %s: the client left and the engine did not end the stream within "
                "%s s of the abort; nothing was recorded",
                self._session_id,
                ABORT_GRACE_S,
            )
        finally:
            self._watch.stop()
