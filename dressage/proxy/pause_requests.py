"""What the rollout pause routes accept: their bodies, and the per-call partial rollout header.

    request = parse_pause_request(body, default_timeout_s=300.0)   # or BadRequest, naming the field
    resume = parse_resume_request(body)
    keep_partial = parse_partial_rollout_header(request.headers.get(PARTIAL_ROLLOUT_HEADER))

What a pause and a resume then do is the pause contract in :mod:`~dressage.proxy.pause_controller`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dressage.config.proxy import MAX_PAUSE_TIMEOUT_S
from dressage.proxy.client import PARTIAL_ROLLOUT_HEADER
from dressage.proxy.engine_answers import parse_version
from dressage.proxy.errors import BadRequest

__all__ = [
    "PAUSE_MODES",
    "PauseRequest",
    "ResumeRequest",
    "parse_partial_rollout_header",
    "parse_pause_request",
    "parse_resume_request",
]

PAUSE_MODES = ("abort", "retract", "in_place")
_MAX_REASON = 500


@dataclass(frozen=True)
class PauseRequest:
    reason: str
    mode: str
    timeout_s: float


@dataclass(frozen=True)
class ResumeRequest:
    version: int | None
    reason: str


def _object(body: Any, allowed: set[str], what: str) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise BadRequest(f"{what}: the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"{what}: unknown fields {unknown}; allowed: {sorted(allowed)}")
    return body


def _reason(body: dict[str, Any], what: str) -> str:
    reason = body.get("reason", "")
    if reason is None:
        return ""
    if not isinstance(reason, str) or len(reason) > _MAX_REASON:
        raise BadRequest(
            f"{what}: reason must be a string of at most {_MAX_REASON} characters",
            param="reason",
        )
    return reason


def parse_pause_request(body: Any, *, default_timeout_s: float) -> PauseRequest:
    """``{"reason"?, "mode"?, "timeout_seconds"?}``; anything else is a 400 naming the field."""
    data = _object(body, {"reason", "mode", "timeout_seconds"}, "pause")
    mode = data.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise BadRequest(
            f"pause: unknown mode {mode!r}; use one of {list(PAUSE_MODES)}",
            param="mode",
            code="invalid_mode",
        )
    timeout = data.get("timeout_seconds", default_timeout_s)
    if timeout is None:
        timeout = default_timeout_s
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_PAUSE_TIMEOUT_S
    ):
        raise BadRequest(
            f"pause: timeout_seconds must be a number in (0, {MAX_PAUSE_TIMEOUT_S:.0f}], "
            f"got {timeout!r}",
            param="timeout_seconds",
            code="invalid_timeout",
        )
    return PauseRequest(reason=_reason(data, "pause"), mode=str(mode), timeout_s=float(timeout))


def parse_partial_rollout_header(value: str | None) -> bool:
    """A chat call's ``X-Dressage-Partial-Rollout``: ``1`` asks partial rollout of the call;
    ``0`` or no header asks nothing (the proxy's switch and the session's flag still apply, so
    a call cannot turn them off). Anything else is a 400 naming the header."""
    if value is None:
        return False
    text = value.strip()
    if text not in ("0", "1"):
        raise BadRequest(
            f"header {PARTIAL_ROLLOUT_HEADER} must be 0 or 1, got {value[:40]!r}",
            param=PARTIAL_ROLLOUT_HEADER,
            code="invalid_header",
        )
    return text == "1"


def parse_resume_request(body: Any) -> ResumeRequest:
    """``{"version"?, "reason"?}``: version a non-negative integer (or its decimal string)."""
    data = _object(body, {"version", "reason"}, "resume")
    raw = data.get("version")
    version: int | None = None
    if raw is not None:
        ok = isinstance(raw, int) and not isinstance(raw, bool)
        ok = ok or (isinstance(raw, str) and raw.strip().isdigit())
        version = parse_version(raw) if ok else -1
        if version < 0:
            raise BadRequest(
                f"resume: version must be a non-negative integer, got {raw!r}",
                param="version",
                code="invalid_version",
            )
    return ResumeRequest(version=version, reason=_reason(data, "resume"))
