"""The proxy's errors and their OpenAI-style bodies: ``{"error": {message, type, param, code}}``.

Every failure an agent or an admin can see is one of these; the server turns it into its HTTP
status with :func:`error_body`, so the OpenAI SDK raises its matching exception
(``BadRequestError`` for 400, ``AuthenticationError`` for 401, ``NotFoundError``,
``ConflictError``, ``APIStatusError`` for 413, ``InternalServerError`` for 5xx).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRequest",
    "ClientClosedRequest",
    "Conflict",
    "ConstraintDropped",
    "EngineFailure",
    "PauseCapExceeded",
    "ProxyError",
    "RequestTooLarge",
    "SessionClosed",
    "SessionNotFound",
    "Unauthorized",
    "VocabularyMismatch",
    "error_body",
]


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, param=self.param, code=self.code)


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class SessionNotFound(ProxyError):
    status = 404
    type = "not_found_error"
    code = "session_not_found"


class SessionClosed(ProxyError):
    status = 409
    type = "conflict_error"
    code = "session_closed"


class Conflict(ProxyError):
    """A control request that contradicts the proxy's state (e.g. a resume to an older weight
    version); nothing changed."""

    status = 409
    type = "conflict_error"
    code = "conflict"


class PauseCapExceeded(ProxyError):
    """The session has spanned more rollout pauses than ``--max-pauses-per-trajectory``: the
    call ends and the trajectory is marked to train nothing. 409, so the OpenAI SDK raises
    ``ConflictError`` (it retries twice; each retry fails the same way at once)."""

    status = 409
    type = "conflict_error"
    code = "max_pauses_exceeded"


class ClientClosedRequest(ProxyError):
    """The agent closed its connection before its call had generated anything; nothing was
    recorded. 499, as nginx logs it: no client is left to read it."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class RequestTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class EngineFailure(ProxyError):
    """The engine could not generate; ``status`` is 503 (down), 502 (failed) or the engine's
    4xx (the request was refused, e.g. longer than the context)."""

    type = "engine_error"

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message, code=code)
        self.status = status
        if 400 <= status < 500:
            self.type = "invalid_request_error"


class ConstraintDropped(ProxyError):
    """A call needs a sampling key that the router in front of the engine drops
    (:mod:`~dressage.proxy.router_fields`): the deployment, not the request, is at fault."""

    status = 501
    type = "server_error"
    code = "constraint_dropped_by_router"


class VocabularyMismatch(ProxyError):
    """The engine serves another vocabulary than the proxy's tokenizer
    (:mod:`~dressage.proxy.vocabulary`): no call can be right, so none is sent. 503, as for an
    engine that is down: the fix is in how the two were started."""

    status = 503
    type = "engine_error"
    code = "vocabulary_mismatch"


def error_body(
    message: str, type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
