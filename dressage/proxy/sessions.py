"""Sessions: one agent run against the proxy, recorded call by call into segments.

    manager = SessionManager(tito, controller, store, config)
    result = await manager.chat("session-7", request)          # one OpenAI chat call
    async for event in manager.chat_stream("session-7", request): ...
    segments = await manager.finalize("session-7")             # list[Segment]
    await manager.open_session("session-8", partial_rollout=True)  # before its agent starts

A call runs: TITO (``extend`` the current segment, or ``start`` one) → one generation through the
controller → the family parser → ``record_output`` → one :class:`StepRecord` appended to the
store → the answer. Calls of one session run one at a time (a per-session lock); sessions run
concurrently. A call that fails anywhere before its step is stored leaves the session exactly
as it was (the TITO state is rolled back), so the agent can simply retry.

Segments: an append-only violation (compaction, an edited message, changed tools, ...) opens a
new segment rendered whole; its first step carries ``boundary_reason``, and the segment before it
ends with finish reason ``segment_boundary``. After a proxy restart the TITO state of an open
session is gone: its next call opens a new segment with ``boundary_reason="proxy_restarted"``
(everything recorded before stays; the session can also just be finalized).

An engine abort that the controller does not resume (one the proxy's rollout pause did not
cause) is recorded with its partial output and finish reason ``abort``, and the agent gets that
partial message with ``finish_reason: "abort"`` (as SGLang's OpenAI server answers); an abort
carrying an error status is an error (nothing recorded). Calls stopped by a rollout pause
(:mod:`~dressage.proxy.pause`) continue after it: their step records every token with its
version and ``extra["pauses"]``. When the engine fails after a call produced tokens (it died
while paused), the step is recorded with those tokens and finish reason ``abort`` (plus
``extra["engine_error"]``) before the agent gets the error. A session past the pause cap gets
409 ``max_pauses_exceeded``; its trajectory is marked ``no_grad_reason`` in the store (the step
that was cut short is recorded first).

Partial rollout per call: a call keeps its partial output across a pause when the proxy runs
with ``--dressage-partial-rollout``, or when the rollout asked it of the call: by the call's
``X-Dressage-Partial-Rollout: 1`` header (what a client the rollout builds can send), or by
opening the session with ``partial_rollout`` before its agent starts (:meth:`open_session`: a
black-box command agent only gets a base URL, so its calls carry no header of ours). The flag is
kept in the store (it survives a restart). The step records who asked (``extra["partial_rollout"]``:
``header`` or ``session``), and a segment opened by such a call records
``dressage_partial_rollout: true`` in its flags.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from dressage.proxy.config import ProxyConfig
from dressage.proxy.engine_client import EngineError, PromptIds
from dressage.proxy.errors import (
    BadRequest,
    EngineFailure,
    PauseCapExceeded,
    SessionClosed,
    SessionNotFound,
)
from dressage.proxy.generation_controller import Generation, GenerationController
from dressage.proxy.openai_api import ChatRequest, new_completion_id
from dressage.proxy.store import TrajectoryStore
from dressage.proxy.streaming import STREAM_FORMATS, IncrementalDecoder, StreamSplitter
from dressage.proxy.tito import TITOInputError, TITOState, TITOTokenizer
from dressage.proxy.turns import PROXY_RESTARTED, Turn, assistant_message, finish_reason, plan_turn
from dressage.trajectory import Segment, StepRecord

__all__ = [
    "PROXY_RESTARTED",
    "ChatResult",
    "SessionManager",
    "StreamDelta",
    "StreamEnd",
    "StreamStart",
    "parse_open_request",
]

_SESSION_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def check_session_id(session_id: str) -> str:
    """Session ids: 1-128 characters of ``[A-Za-z0-9._:-]`` (URL path and routing key safe)."""
    if not 0 < len(session_id) <= 128 or not _SESSION_ID_CHARS.issuperset(session_id):
        raise BadRequest(
            f"session id {session_id[:140]!r} must be 1-128 characters of [A-Za-z0-9._:-]",
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


class _Session:
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


@dataclass
class ChatResult:
    """What one chat call produced and recorded."""

    completion_id: str
    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    weight_version: str
    step: StepRecord
    logprobs: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StreamStart:
    completion_id: str


@dataclass(frozen=True)
class StreamDelta:
    fields: dict[str, str]
    """``reasoning_content`` and/or ``content`` text to send."""


@dataclass(frozen=True)
class StreamEnd:
    result: ChatResult
    fields: dict[str, str]
    """What is left to send of the recorded message (see :mod:`~dressage.proxy.streaming`)."""


class SessionManager:
    """All sessions of one proxy (see the module docstring)."""

    def __init__(
        self,
        tito: TITOTokenizer,
        controller: GenerationController,
        store: TrajectoryStore,
        config: ProxyConfig,
    ) -> None:
        self.tito = tito
        self.controller = controller
        self.store = store
        self.config = config
        self._open: dict[str, _Session] = {}
        self._stream_format = STREAM_FORMATS.get(tito.parser_family or "")
        self.counters: Counter[str] = Counter()

    # ------------------------------------------------------------------------------ lookup
    def _session(self, session_id: str) -> _Session:
        session = self._open.get(session_id)
        if session is not None:
            return session
        record = self.store.sessions.get(session_id)
        if record is not None and record.status != "open":
            raise SessionClosed(f"session {session_id} is {record.status}; start a new session")
        if record is None:
            session = _Session(check_session_id(session_id))
        else:  # recorded before a restart: its next call opens a new segment
            session = _Session(
                session_id, next_step=record.next_step_index, segment=record.last_segment_index
            )
        self._open[session_id] = session
        return session

    def exists(self, session_id: str) -> bool:
        return session_id in self._open or session_id in self.store.sessions

    # ------------------------------------------------------------------------------ a call
    def _begin(self, session: _Session, request: ChatRequest) -> Turn:
        try:
            return plan_turn(
                self.tito,
                session.state,
                request,
                segment=session.segment,
                prompt=session.prompt,
                restarted=session.restarted,
            )
        except TITOInputError as exc:
            raise BadRequest(f"session {session.id}: {exc}", param="messages") from None

    def _sampling(self, request: ChatRequest) -> dict[str, Any]:
        stops = self.tito.stop_token_ids
        extra = request.sampling.get("stop_token_ids")
        if extra:
            stops = [*stops, *(t for t in extra if t not in stops)]
        return {**request.sampling, "stop_token_ids": stops}

    def _keep_partial(self, session_id: str, request: ChatRequest) -> bool:
        """The rollout asked this call to keep its partial output (header or session flag)."""
        if request.partial_rollout:
            return True
        record = self.store.sessions.get(session_id)
        return record is not None and record.partial_rollout

    def _step_extra(
        self, turn: Turn, request: ChatRequest, gen: Generation, error: str | None
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {
            "weight_version": gen.weight_version,
            "engine_finish": gen.finish,
            "engine_requests": gen.engine_requests,
            "model": request.model,
        }
        if gen.cached_tokens is not None:
            extra["cached_tokens"] = gen.cached_tokens
        if gen.pauses:
            extra["pauses"] = gen.pauses
        if gen.discarded_tokens:
            extra["discarded_tokens"] = gen.discarded_tokens
        if gen.no_grad_reason:
            extra["no_grad_reason"] = gen.no_grad_reason
        if error:
            extra["engine_error"] = error
        if gen.keep_partial:
            extra["partial_rollout"] = "header" if request.partial_rollout else "session"
        if turn.prefix_length == 0:
            flags = self.config.segment_flags()
            flags["dressage_partial_rollout"] = self.config.partial_rollout or gen.keep_partial
            extra["segment"] = {
                "flags": flags,
                "tools": request.tools,
                "chat_template_kwargs": request.chat_template_kwargs,
            }
        if turn.boundary_reason:
            extra["boundary_detail"] = turn.boundary_detail
        return extra

    async def _record(
        self,
        session: _Session,
        turn: Turn,
        request: ChatRequest,
        generation: Generation,
        completion_id: str,
        started: float,
        *,
        error: str | None = None,
    ) -> ChatResult:
        """Parse, append to the TITO state, store the step durably, then commit the session."""
        message = assistant_message(self.tito, turn, generation)
        finish = finish_reason(generation, message)
        prompt_end = len(turn.state.ids)
        self.tito.record_output(turn.state, generation.output_ids, assistant_message=message)
        try:
            step = StepRecord(
                session_id=session.id,
                step_index=session.next_step,
                segment_index=turn.segment,
                prefix_length=turn.prefix_length,
                prompt_delta_ids=turn.state.ids[turn.prefix_length : prompt_end],
                output_ids=generation.output_ids,
                output_logprobs=generation.logprobs,
                output_versions=generation.versions,
                finish_reason=finish,
                messages=turn.state.messages[turn.first_message :],
                started_at=started,
                ended_at=time.time(),
                boundary_reason=turn.boundary_reason,
                request_id=completion_id,
                extra=self._step_extra(turn, request, generation, error),
            )
        except ValueError as exc:  # the engine's answer breaks a record invariant
            raise EngineFailure(
                f"session {session.id} step {session.next_step}: the engine's output cannot be "
                f"recorded: {exc}",
                status=502,
                code="engine_output_invalid",
            ) from None
        durable = self.store.write_step(step)
        # Written: from here on the call has happened, whatever comes next (a failed fsync, a
        # cancelled task) - the session moves on with it, as a restart would read it back.
        turn.committed = True
        session.state = turn.state
        session.prompt = turn.prompt.extended(generation.output_ids)
        session.segment = turn.segment
        session.next_step += 1
        session.restarted = False
        self.counters["calls"] += 1
        if generation.pauses:
            self.counters["paused_calls"] += 1
        if generation.discarded_tokens:
            self.counters["discarded_tokens"] += generation.discarded_tokens
        if turn.boundary_reason:
            self.counters[f"boundary:{turn.boundary_reason}"] += 1
        await durable
        return ChatResult(
            completion_id=completion_id,
            message=message,
            finish_reason=finish,
            prompt_tokens=prompt_end,
            completion_tokens=len(generation.output_ids),
            cached_tokens=generation.cached_tokens,
            weight_version=generation.weight_version,
            step=step,
            logprobs=self._logprobs(generation) if request.logprobs else None,
        )

    async def _keep_interrupted(
        self,
        session: _Session,
        turn: Turn,
        request: ChatRequest,
        exc: Exception,
        completion_id: str,
        started: float,
    ) -> None:
        """A call that fails for good: record what it generated, mark a capped trajectory."""
        if isinstance(exc, PauseCapExceeded):
            await self.store.mark_no_grad(session.id, exc.message)
            self.counters["pause_cap_exceeded"] += 1
            return
        partial = getattr(exc, "partial_generation", None)
        if isinstance(partial, Generation) and partial.output_ids:
            await self._record(
                session, turn, request, partial, completion_id, started, error=str(exc)
            )
            self.counters["interrupted_calls_recorded"] += 1

    async def _check_no_grad(self, session: _Session, generation: Generation) -> None:
        """The pause cap ended this call (its step is recorded): mark the trajectory, fail."""
        if generation.no_grad_reason:
            await self.store.mark_no_grad(session.id, generation.no_grad_reason)
            self.counters["pause_cap_exceeded"] += 1
            raise PauseCapExceeded(generation.no_grad_reason)

    def _logprobs(self, generation: Generation) -> list[dict[str, Any]]:
        out = []
        for token_id, logprob in zip(generation.output_ids, generation.logprobs, strict=True):
            token = self.tito.decode([token_id])
            out.append(
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": [],
                }
            )
        return out

    def _open_for_call(self, session_id: str) -> _Session:
        session = self._session(session_id)
        if session.closed:
            raise SessionClosed(f"session {session_id} was finalized or discarded")
        return session

    async def chat(self, session_id: str, request: ChatRequest) -> ChatResult:
        """One non-streaming chat call, recorded before it returns."""
        session = self._open_for_call(session_id)
        async with session.lock:
            if session.closed:
                raise SessionClosed(f"session {session_id} was finalized or discarded")
            started = time.time()
            turn = self._begin(session, request)
            completion_id = new_completion_id()
            try:
                try:
                    generation = await self.controller.generate(
                        session_id,
                        turn.prompt,
                        self._sampling(request),
                        request_id=completion_id,
                        keep_partial=self._keep_partial(session_id, request),
                    )
                except (EngineError, PauseCapExceeded) as exc:
                    await self._keep_interrupted(
                        session, turn, request, exc, completion_id, started
                    )
                    raise
                result = await self._record(
                    session, turn, request, generation, completion_id, started
                )
                await self._check_no_grad(session, generation)
                return result
            except BaseException:
                if not turn.committed:
                    turn.undo()
                    self.counters["failed_calls"] += 1
                raise

    async def chat_stream(
        self, session_id: str, request: ChatRequest
    ) -> AsyncGenerator[StreamStart | StreamDelta | StreamEnd, None]:
        """One streaming chat call: :class:`StreamStart` once the engine streams, deltas, then
        :class:`StreamEnd` after the step is stored. Errors before ``StreamStart`` are raised
        before anything is sent, so the server can answer them with an HTTP status."""
        session = self._open_for_call(session_id)
        async with session.lock:
            if session.closed:
                raise SessionClosed(f"session {session_id} was finalized or discarded")
            started = time.time()
            turn = self._begin(session, request)
            completion_id = new_completion_id()
            splitter = StreamSplitter(
                self._stream_format,
                thinking=self.tito.thinking(turn.state.chat_template_kwargs),
                stops=request.sampling.get("stop") or (),
            )
            decoder = IncrementalDecoder(self.tito.decode)
            try:
                deltas = self.controller.generate_stream(
                    session_id,
                    turn.prompt,
                    self._sampling(request),
                    request_id=completion_id,
                    keep_partial=self._keep_partial(session_id, request),
                )
                async with aclosing(deltas):
                    generation: Generation | None = None
                    first = True
                    try:
                        async for delta in deltas:
                            if first:
                                first = False
                                yield StreamStart(completion_id)
                            if delta.done is not None:
                                generation = delta.done
                                break
                            fields = splitter.push(decoder.push(delta.output_ids))
                            if fields:
                                yield StreamDelta(fields)
                    except (EngineError, PauseCapExceeded) as exc:
                        await self._keep_interrupted(
                            session, turn, request, exc, completion_id, started
                        )
                        raise
                assert generation is not None
                # a character split at the very end: sent with the closing deltas
                tail = splitter.push(decoder.flush())
                result = await self._record(
                    session, turn, request, generation, completion_id, started
                )
                await self._check_no_grad(session, generation)
            except BaseException:
                if not turn.committed:
                    turn.undo()
                    self.counters["failed_calls"] += 1
                raise
            if splitter.diverged:
                self.counters["stream_divergences"] += 1
            closing = splitter.finish(result.message)
            for key, text in tail.items():
                closing[key] = text + closing.get(key, "")
            yield StreamEnd(result, closing)

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

    async def finalize(self, session_id: str) -> list[Segment]:
        """Close the session (after any call in flight) and return its segments."""
        if not self.exists(session_id):
            raise SessionNotFound(f"session {session_id} is unknown")
        record = self.store.sessions.get(session_id)
        if record is not None and record.status == "discarded":
            raise SessionClosed(f"session {session_id} was discarded; it has no segments")
        segments: list[Segment] = await self._close(session_id, self.store.finalize)
        self.controller.forget(session_id)
        self.counters["finalized"] += 1
        return segments

    async def discard(self, session_id: str) -> int:
        """Drop the session; returns how many steps it had recorded."""
        if not self.exists(session_id):
            raise SessionNotFound(f"session {session_id} is unknown")
        record = self.store.sessions.get(session_id)
        if record is not None and record.status == "finalized":
            raise SessionClosed(f"session {session_id} is finalized; it cannot be discarded")
        await self._close(session_id, self.store.discard)
        self.controller.forget(session_id)
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
