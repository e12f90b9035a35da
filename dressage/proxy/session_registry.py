"""The proxy's sessions as a registry: lookup, open, finalize, discard, and what they hold.

    registry.open_session("session-8", partial_rollout=True)   # before its agent starts
    segments = await registry.finalize("session-7")            # list[Segment]
    registry.trajectory("session-7"); registry.session_stats("session-7"); registry.stats()

:class:`~dressage.proxy.sessions.SessionManager` adds the calls themselves. A session is open
in memory from its first call (or ``open``) until it is finalized or discarded; one recorded
before a restart is found in the store and continues with a new segment.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from dressage.proxy.engine_client import PromptIds
from dressage.proxy.errors import BadRequest, SessionClosed, SessionNotFound
from dressage.proxy.generation_controller import GenerationController
from dressage.proxy.store import TrajectoryStore
from dressage.proxy.tito import TITOState
from dressage.trajectory import Segment

__all__ = ["OpenSession", "SessionRegistry", "check_session_id", "parse_open_request"]

_SESSION_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def check_session_id(session_id: str) -> str:
    """Session ids: 1-128 characters of ``[A-Za-z0-9._:-]``, not ``.`` or ``..`` (URL path
    segments that clients and proxies normalise away, and routing keys)."""
    if (
        not 0 < len(session_id) <= 128
        or not _SESSION_ID_CHARS.issuperset(session_id)
        or session_id in (".", "..")
    ):
        raise BadRequest(
            f"session id {session_id[:140]!r} must be 1-128 characters of [A-Za-z0-9._:-], "
            "and not '.' or '..'",
            param="session_id",
        )
    return session_id


def parse_open_request(body: Any) -> bool:
    """``POST /v1/sessions/{id}/open`` body ``{"partial_rollout"?: bool}`` (none: false): the
    session's partial rollout flag. Anything else is a 400 naming the field."""
    if body is None:
        return False
    if not isinstance(body, dict):
        raise BadRequest(f"open: the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"partial_rollout"})
    if unknown:
        raise BadRequest(f"open: unknown fields {unknown}; allowed: ['partial_rollout']")
    value = body.get("partial_rollout", False)
    if not isinstance(value, bool):
        raise BadRequest(
            f"open: partial_rollout must be true or false, got {value!r}", param="partial_rollout"
        )
    return value


class OpenSession:
    """In-memory state of an open session (kept small: the TITO state is most of it)."""

    __slots__ = ("id", "lock", "next_step", "prompt", "restarted", "segment", "state", "closed")

    def __init__(self, session_id: str, *, next_step: int = 0, segment: int = -1) -> None:
        self.id = session_id
        self.lock = asyncio.Lock()
        self.state: TITOState | None = None
        """TITO state of the current segment (None before the first call and after a restart)."""
        self.prompt = PromptIds(b"", 0)
        """``state.ids`` as JSON text (each recorded step appends its part)."""
        self.segment = segment
        """Index of the current segment (of the last recorded step when ``state`` is None)."""
        self.next_step = next_step
        self.restarted = next_step > 0
        self.closed = False


class SessionRegistry:
    """Sessions by id (see the module docstring)."""

    def __init__(self, store: TrajectoryStore, controller: GenerationController) -> None:
        self.store = store
        self.controller = controller
        self._open: dict[str, OpenSession] = {}
        self.counters: Counter[str] = Counter()

    def _session(self, session_id: str) -> OpenSession:
        session = self._open.get(session_id)
        if session is not None:
            return session
        record = self.store.sessions.get(session_id)
        if record is not None and record.status != "open":
            raise SessionClosed(f"session {session_id} is {record.status}; start a new session")
        if record is None:
            session = OpenSession(check_session_id(session_id))
        else:  # recorded before a restart: its next call opens a new segment
            session = OpenSession(
                session_id, next_step=record.next_step_index, segment=record.last_segment_index
            )
        self._open[session_id] = session
        return session

    def exists(self, session_id: str) -> bool:
        return session_id in self._open or session_id in self.store.sessions

    def _open_for_call(self, session_id: str) -> OpenSession:
        session = self._session(session_id)
        if session.closed:
            raise SessionClosed(f"session {session_id} was finalized or discarded")
        return session

    # ------------------------------------------------------------------------------ session API
    async def open_session(self, session_id: str, *, partial_rollout: bool) -> dict[str, Any]:
        """Open (or find) a session and set what its calls ask (see the module docstring)."""
        session = self._open_for_call(session_id)  # a closed session: 409, nothing written
        await self.store.set_partial_rollout(session.id, partial_rollout)
        return {"session_id": session.id, "status": "open", "partial_rollout": partial_rollout}

    async def _close(self, session_id: str, act: Callable[[str], Awaitable[Any]]) -> Any:
        """``act(session_id)`` on the store, after any call in flight, and forget the session."""
        session = self._open.get(session_id)
        if session is None:
            return await act(session_id)
        async with session.lock:
            session.closed = True
            result = await act(session_id)
        self._open.pop(session_id, None)
        return result

    def _closing(
        self, act: Callable[[str], Awaitable[Any]]
    ) -> Callable[[str], Awaitable[tuple[bool, Any]]]:
        """``act`` that also says whether it closed the session (it was open just before), so a
        second finalize or discard of the same session is not counted again."""

        async def closing(session_id: str) -> tuple[bool, Any]:
            record = self.store.sessions.get(session_id)
            was_open = record is None or record.status == "open"
            return was_open, await act(session_id)

        return closing

    async def finalize(self, session_id: str) -> list[Segment]:
        """Close the session (after any call in flight) and return its segments."""
        if not self.exists(session_id):
            raise SessionNotFound(f"session {session_id} is unknown")
        record = self.store.sessions.get(session_id)
        if record is not None and record.status == "discarded":
            raise SessionClosed(f"session {session_id} was discarded; it has no segments")
        closed_now, segments = await self._close(session_id, self._closing(self.store.finalize))
        self.controller.forget(session_id)
        if closed_now:  # finalizing again returns the same segments and is not a new session
            self.counters["finalized"] += 1
        return list(segments)

    async def discard(self, session_id: str) -> int:
        """Drop the session; returns how many steps it had recorded."""
        if not self.exists(session_id):
            raise SessionNotFound(f"session {session_id} is unknown")
        record = self.store.sessions.get(session_id)
        if record is not None and record.status == "finalized":
            raise SessionClosed(f"session {session_id} is finalized; it cannot be discarded")
        closed_now, _ = await self._close(session_id, self._closing(self.store.discard))
        self.controller.forget(session_id)
        if closed_now:
            self.counters["discarded"] += 1
        record = self.store.sessions.get(session_id)
        return record.num_steps if record is not None else 0

    def trajectory(self, session_id: str) -> dict[str, Any]:
        """Status, steps, (closed or final) segments and what the store lost of them, as plain
        dicts (:meth:`TrajectoryStore.trajectory`)."""
        if session_id in self.store.sessions:
            return self.store.trajectory(session_id)
        if session_id in self._open:  # no call recorded yet
            empty: dict[str, Any] = {"steps": [], "segments": [], "damage": []}
            return {"session_id": session_id, "status": "open", **empty}
        raise SessionNotFound(f"session {session_id} is unknown")

    def session_stats(self, session_id: str) -> dict[str, Any]:
        record = self.store.sessions.get(session_id)
        session = self._open.get(session_id)
        if record is None and session is None:
            raise SessionNotFound(f"session {session_id} is unknown")
        return {
            "session_id": session_id,
            "status": record.status if record is not None else "open",
            "steps": record.num_steps if record is not None else 0,
            "segments": (record.last_segment_index + 1) if record is not None else 0,
            "tokens": record.tokens if record is not None else 0,
            "boundaries": dict(record.boundaries or {}) if record is not None else {},
            "current_segment_tokens": len(session.state.ids)
            if session is not None and session.state is not None
            else 0,
            "in_flight": bool(session is not None and session.lock.locked()),
        }

    def stats(self) -> dict[str, Any]:
        statuses = Counter(r.status for r in self.store.sessions.values())
        return {
            "sessions": {
                "in_memory": len(self._open),
                "open": statuses["open"],
                "finalized": statuses["finalized"],
                "discarded": statuses["discarded"],
            },
            "in_flight": sum(1 for s in self._open.values() if s.lock.locked()),
            "counters": dict(self.counters),
        }
