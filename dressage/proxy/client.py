"""Clients of the proxy for rollout code: one async, one sync, the same methods.

    async with ProxyClient("http://127.0.0.1:8000", admin_key=KEY) as proxy:
        await proxy.open_session("rollout-17-0", partial_rollout=True)  # optional, see below
        agent_base_url = proxy.session_base_url("rollout-17-0")     # give this to the agent
        ...                                                         # the agent runs
        segments = await proxy.finalize_session("rollout-17-0")     # list[Segment]

    proxy = SyncProxyClient("http://127.0.0.1:8000", admin_key=KEY)
    proxy.chat_completions("s1", [{"role": "user", "content": "hi"}], max_tokens=64)

``chat_completions`` is a plain OpenAI chat call (non-streaming) in a session, for scripted
agents and tests; real agents use any OpenAI client with :meth:`session_base_url`. Failures
raise :class:`ProxyClientError` with the status and the proxy's error message.

``open_session(..., partial_rollout=True)`` asks partial rollout of every call of the session (its
calls keep their partial output across a rollout pause, see :mod:`~dressage.proxy.sessions`):
the way to ask it for an agent whose requests cannot carry the ``X-Dressage-Partial-Rollout``
header.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from dressage.tls import tls_context
from dressage.trajectory import Segment, StepRecord

__all__ = [
    "PARTIAL_ROLLOUT_HEADER",
    "ProxyClient",
    "ProxyClientError",
    "SyncProxyClient",
    "Trajectory",
]

T = TypeVar("T")

PARTIAL_ROLLOUT_HEADER = "X-Dressage-Partial-Rollout"
"""Chat-call header: ``1`` keeps the call's partial output across a rollout pause, even when the
proxy runs without ``--dressage-partial-rollout`` (see :mod:`~dressage.proxy.pause_controller`)."""


class ProxyClientError(RuntimeError):
    def __init__(self, method: str, url: str, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else str(body)[:500]
        super().__init__(f"{method} {url}: HTTP {status}: {message}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Trajectory:
    """A session as the store holds it: its steps, and its closed (or, once finalized, all)
    segments."""

    session_id: str
    status: str
    steps: list[StepRecord]
    segments: list[Segment]
    damage: list[dict[str, Any]] = field(default_factory=list)
    """What the proxy's store lost of the session (``Damage.to_dict()`` entries)."""


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    admin: bool
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None


def _segments(data: dict[str, Any]) -> list[Segment]:
    return [Segment.from_dict(s) for s in data["segments"]]


def _trajectory(data: dict[str, Any]) -> Trajectory:
    return Trajectory(
        session_id=data["session_id"],
        status=data["status"],
        steps=[StepRecord.from_dict(s) for s in data["steps"]],
        segments=_segments(data),
        damage=list(data.get("damage") or []),
    )


class _Base:
    def __init__(
        self,
        base_url: str,
        *,
        admin_key: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.admin_key = admin_key
        self.api_key = api_key

    def session_base_url(self, session_id: str) -> str:
        """The OpenAI base URL an unmodified agent uses for ``session_id``."""
        return f"{self.base_url}/sessions/{session_id}/v1"

    def _headers(self, call: _Call) -> dict[str, str]:
        key = self.admin_key if call.admin else (self.api_key or self.admin_key)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return headers | (call.headers or {})

    def _result(self, call: _Call, response: httpx.Response, parse: Callable[[Any], T]) -> T:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code != 200:
            raise ProxyClientError(call.method, call.path, response.status_code, body)
        return parse(body)

    @staticmethod
    def _chat(session_id: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> _Call:
        body = {"model": params.pop("model", "dressage"), "messages": messages, **params}
        if body.get("stream"):
            raise ValueError("chat_completions is non-streaming; use an OpenAI client to stream")
        return _Call("POST", f"/sessions/{session_id}/v1/chat/completions", False, body)

    @staticmethod
    def _session(session_id: str, action: str, method: str = "POST") -> _Call:
        return _Call(method, f"/v1/sessions/{session_id}/{action}", True)

    @staticmethod
    def _open(session_id: str, partial_rollout: bool) -> _Call:
        body = {"partial_rollout": partial_rollout}
        return _Call("POST", f"/v1/sessions/{session_id}/open", True, body)

    @staticmethod
    def _pause(reason: str, mode: str, timeout_seconds: float | None) -> _Call:
        body: dict[str, Any] = {"reason": reason, "mode": mode}
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        return _Call("POST", "/v1/rollout/pause", True, body)

    @staticmethod
    def _resume(version: int | None, reason: str) -> _Call:
        return _Call("POST", "/v1/rollout/resume", True, {"version": version, "reason": reason})


class ProxyClient(_Base):
    """Async client (httpx); use as ``async with`` or call :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        *,
        admin_key: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        super().__init__(base_url, admin_key=admin_key, api_key=api_key)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, verify=tls_context()
        )

    async def _run(self, call: _Call, parse: Callable[[Any], T]) -> T:
        response = await self._http.request(
            call.method, call.path, json=call.body, headers=self._headers(call)
        )
        return self._result(call, response, parse)

    async def chat_completions(
        self, session_id: str, messages: list[dict[str, Any]], **params: Any
    ) -> dict[str, Any]:
        """One OpenAI chat completion in ``session_id``; returns the response object."""
        return await self._run(self._chat(session_id, messages, params), dict)

    async def open_session(self, session_id: str, *, partial_rollout: bool) -> dict[str, Any]:
        """Open the session before its agent runs, with its partial rollout flag."""
        return await self._run(self._open(session_id, partial_rollout), dict)

    async def finalize_session(self, session_id: str) -> list[Segment]:
        return await self._run(self._session(session_id, "finalize"), _segments)

    async def discard_session(self, session_id: str) -> int:
        """Returns how many steps the discarded session had."""
        return await self._run(self._session(session_id, "discard"), lambda d: int(d["steps"]))

    async def read_trajectory(self, session_id: str) -> Trajectory:
        return await self._run(self._session(session_id, "trajectory", "GET"), _trajectory)

    async def session_stats(self, session_id: str) -> dict[str, Any]:
        return await self._run(self._session(session_id, "stats", "GET"), dict)

    async def stats(self) -> dict[str, Any]:
        return await self._run(_Call("GET", "/v1/stats", True), dict)

    async def capabilities(self) -> dict[str, Any]:
        return await self._run(_Call("GET", "/v1/capabilities", False), dict)

    async def pause_rollout(
        self, reason: str = "", *, mode: str = "abort", timeout_seconds: float | None = None
    ) -> dict[str, Any]:
        """Pause all generation (see dressage.proxy.pause_controller); the pause report."""
        return await self._run(self._pause(reason, mode, timeout_seconds), dict)

    async def resume_rollout(self, version: int | None = None, reason: str = "") -> dict[str, Any]:
        """Continue paused generation with weight version ``version``; the resume report."""
        return await self._run(self._resume(version, reason), dict)

    async def pause_state(self) -> dict[str, Any]:
        return await self._run(_Call("GET", "/v1/rollout/pause_state", True), dict)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ProxyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SyncProxyClient(_Base):
    """Blocking client (httpx); use as ``with`` or call :meth:`close`."""

    def __init__(
        self,
        base_url: str,
        *,
        admin_key: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        super().__init__(base_url, admin_key=admin_key, api_key=api_key)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, verify=tls_context())

    def _run(self, call: _Call, parse: Callable[[Any], T]) -> T:
        response = self._http.request(
            call.method, call.path, json=call.body, headers=self._headers(call)
        )
        return self._result(call, response, parse)

    def chat_completions(
        self, session_id: str, messages: list[dict[str, Any]], **params: Any
    ) -> dict[str, Any]:
        """One OpenAI chat completion in ``session_id``; returns the response object."""
        return self._run(self._chat(session_id, messages, params), dict)

    def open_session(self, session_id: str, *, partial_rollout: bool) -> dict[str, Any]:
        """Open the session before its agent runs, with its partial rollout flag."""
        return self._run(self._open(session_id, partial_rollout), dict)

    def finalize_session(self, session_id: str) -> list[Segment]:
        return self._run(self._session(session_id, "finalize"), _segments)

    def discard_session(self, session_id: str) -> int:
        """Returns how many steps the discarded session had."""
        return self._run(self._session(session_id, "discard"), lambda d: int(d["steps"]))

    def read_trajectory(self, session_id: str) -> Trajectory:
        return self._run(self._session(session_id, "trajectory", "GET"), _trajectory)

    def session_stats(self, session_id: str) -> dict[str, Any]:
        return self._run(self._session(session_id, "stats", "GET"), dict)

    def stats(self) -> dict[str, Any]:
        return self._run(_Call("GET", "/v1/stats", True), dict)

    def capabilities(self) -> dict[str, Any]:
        return self._run(_Call("GET", "/v1/capabilities", False), dict)

    def pause_rollout(
        self, reason: str = "", *, mode: str = "abort", timeout_seconds: float | None = None
    ) -> dict[str, Any]:
        """Pause all generation (see dressage.proxy.pause_controller); the pause report."""
        return self._run(self._pause(reason, mode, timeout_seconds), dict)

    def resume_rollout(self, version: int | None = None, reason: str = "") -> dict[str, Any]:
        """Continue paused generation with weight version ``version``; the resume report."""
        return self._run(self._resume(version, reason), dict)

    def pause_state(self) -> dict[str, Any]:
        return self._run(_Call("GET", "/v1/rollout/pause_state", True), dict)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SyncProxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
