"""Bodies in, errors out: how the proxy's routes read requests and answer failures.

    body = await read_json(request, config.max_request_bytes)   # 413, or 400 naming the place
    return json_response(as_proxy_error(exc).body(), status)

Request bodies are capped (413 past ``--max-request-bytes``, before they are read whole) and
parsed by :func:`dressage.http_json.parse_json_body` (too deep, a lone surrogate: 400 naming
where). A failure becomes a :class:`~dressage.proxy.errors.ProxyError`; what an agent sees of an
engine failure never holds the engine's address (the log keeps it whole): a client of the proxy
has no business knowing where the engine runs, and the URL may be internal.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from dressage.http_json import BodyTooLarge, JSONBodyError, parse_json_body, read_limited_body
from dressage.proxy.engine_answers import EngineError, EngineUnavailableError
from dressage.proxy.errors import BadRequest, EngineFailure, ProxyError, RequestTooLarge
from dressage.proxy.openai_api import dumps
from dressage.proxy.store import StoreError

__all__ = ["as_proxy_error", "json_response", "read_json", "read_optional_json", "scrub_urls"]

_URL = re.compile(r"https?://[^\s'\"),\]]+")


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type="application/json")


def scrub_urls(text: str) -> str:
    """``text`` with every URL replaced by ``<engine>`` (what clients see of engine errors)."""

    def hide(match: re.Match[str]) -> str:
        url = match.group(0)
        kept = url.rstrip(":.;")  # punctuation after the URL belongs to the sentence
        return "<engine>" + url[len(kept) :]

    return _URL.sub(hide, text)


def _parse(raw: bytes) -> Any:
    try:
        return parse_json_body(raw)
    except JSONBodyError as exc:
        raise BadRequest(str(exc), param=exc.param) from None


async def read_json(request: Request, limit: int) -> Any:
    """The JSON body, read at most ``limit`` bytes far (413 beyond)."""
    try:
        raw = await read_limited_body(request, limit)
    except BodyTooLarge as exc:
        size = "" if exc.declared is None else f" ({exc.declared} bytes)"
        raise RequestTooLarge(f"the request body{size} exceeds {limit} bytes") from None
    return _parse(raw)


async def read_optional_json(request: Request, limit: int) -> Any:
    """A control body: JSON, or None when the body is empty."""
    raw = await request.body()
    if len(raw) > limit:
        raise RequestTooLarge(f"the request body exceeds {limit} bytes")
    if not raw.strip():
        return None
    return _parse(raw)


def as_proxy_error(exc: Exception) -> ProxyError:
    """The client-facing form of any failure (engine addresses scrubbed)."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, EngineError):
        code = "engine_unavailable" if isinstance(exc, EngineUnavailableError) else "engine_error"
        if 400 <= exc.status < 500:
            code = "engine_rejected"
        return EngineFailure(scrub_urls(str(exc)), status=exc.status, code=code)
    if isinstance(exc, StoreError):
        return ProxyError(f"trajectory store failure: {exc}", code="store_error")
    return ProxyError(f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
