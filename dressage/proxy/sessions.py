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
carrying an error status is an error (nothing recorded). When the engine fails after a call
produced tokens, the step is recorded with those tokens and finish reason ``abort`` (plus
``extra["engine_error"]``) before the agent gets the error. Rollout pauses (what a stopped call
sees and records, partial rollout per call, the pause cap): :mod:`~dressage.proxy.pause_controller`.

A call's input is bounded by the engine's context (:mod:`~dressage.proxy.limits`): one that
cannot fit is refused before it is tokenized, one whose prompt is too long after tokenizing is
refused before the engine sees it, and a call without ``max_tokens`` gets the proxy's bounded
default (``--default-max-tokens``) within what the context leaves. Tokenizing a large input
(over ``OFFLOAD_CHARS`` new characters) runs on a worker thread, on a copy of the segment's
state, so that other sessions and ``/health`` go on meanwhile.

An agent that closes its connection mid-call (a client timeout) is not kept generating for: the
server sets the call's ``client_gone`` event, the engine request is aborted, and what it had
generated is recorded as an unanswered step (finish reason ``abort``,
``extra["client_disconnected"]``) and the trajectory is marked ``no_grad_reason``: tokens the
agent never received must not train as if it had acted on them. A call that had generated
nothing records nothing.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from dressage.config.proxy import ProxyConfig
from dressage.proxy.constraints import engine_constraint
from dressage.proxy.engine_answers import EngineError
from dressage.proxy.errors import (
    BadRequest,
    ClientClosedRequest,
    EngineFailure,
    PauseCapExceeded,
    SessionClosed,
)
from dressage.proxy.generation_controller import Generation, GenerationController
from dressage.proxy.limits import EngineContext, InputLimits, default_budget, input_chars
from dressage.proxy.openai_api import ChatRequest, new_completion_id
from dressage.proxy.router_fields import RouterFieldCheck
from dressage.proxy.session_registry import (
    OpenSession,
    SessionRegistry,
    check_session_id,
    parse_open_request,
)
from dressage.proxy.store import TrajectoryStore
from dressage.proxy.streaming import STREAM_FORMATS, IncrementalDecoder, StreamSplitter
from dressage.proxy.tito import TITOInputError, TITOTokenizer
from dressage.proxy.turns import (
    PROXY_RESTARTED,
    Turn,
    assistant_message,
    finish_reason,
    plan_turn,
    step_extra,
    token_logprobs,
)
from dressage.proxy.vocabulary import VocabularyCheck, tokenizer_name
from dressage.trajectory import StepRecord

__all__ = [
    "PROXY_RESTARTED",
    "ChatResult",
    "SessionManager",
    "StreamDelta",
    "StreamEnd",
    "StreamStart",
    "check_session_id",
    "parse_open_request",
]

OFFLOAD_CHARS = 32_768
"""New message characters above which TITO runs on a worker thread (~20 ms of tokenizing)."""


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
    logprobs: list[dict[str, Any]] | None = None
    """``logprobs.content`` entries of the tokens received since the last delta (when asked)."""


@dataclass(frozen=True)
class StreamEnd:
    result: ChatResult
    fields: dict[str, str]
    """What is left to send of the recorded message (see :mod:`~dressage.proxy.streaming`)."""
    logprobs: list[dict[str, Any]] | None = None
    """The entries of the tokens not sent with a delta yet (when asked): all the stream's
    chunks together carry the non-streamed answer's ``logprobs.content``."""


class SessionManager(SessionRegistry):
    """All sessions of one proxy and their calls (see the module docstring)."""

    def __init__(
        self,
        tito: TITOTokenizer,
        controller: GenerationController,
        store: TrajectoryStore,
        config: ProxyConfig,
    ) -> None:
        super().__init__(store, controller)
        self.tito = tito
        self.config = config
        self.limits = InputLimits(controller.engine, tito.tokenizer)
        self.vocabulary = VocabularyCheck(
            controller.engine, tito.tokenizer, tokenizer_name=tokenizer_name(config)
        )
        self.forwarded = RouterFieldCheck(controller.engine)
        self._stream_format = STREAM_FORMATS.get(tito.parser_family or "")

    # ------------------------------------------------------------------------------ a call
    async def _begin(
        self, session: OpenSession, request: ChatRequest
    ) -> tuple[Turn, EngineContext | None]:
        """The call's turn, within the engine's context (see the module docstring)."""
        where = f"session {session.id}"
        await self.vocabulary.verified()
        context = await self.limits.context()
        self.limits.refuse_impossible(input_chars(request.messages), context, where)
        state = session.state
        known = len(state.messages) if state is not None else 0
        offload = input_chars(request.messages[known:]) > OFFLOAD_CHARS
        plan = functools.partial(
            plan_turn,
            self.tito,
            segment=session.segment,
            prompt=session.prompt,
            restarted=session.restarted,
        )
        try:
            if offload:  # on a copy: nothing the thread does touches the session's own state
                copy = state.copy() if state is not None else None
                turn = await asyncio.to_thread(plan, copy, request)
            else:
                turn = plan(state, request)
        except TITOInputError as exc:
            raise BadRequest(f"{where}: {exc}", param="messages") from None
        try:
            self.limits.refuse_too_long(turn.prompt.length, context, where)
        except BadRequest:
            turn.undo()
            raise
        return turn, context

    async def _sampling(
        self, request: ChatRequest, turn: Turn, context: EngineContext | None
    ) -> dict[str, Any]:
        stops = self.tito.stop_token_ids
        extra = request.sampling.get("stop_token_ids")
        if extra:
            stops = [*stops, *(t for t in extra if t not in stops)]
        sampling = {**request.sampling, "stop_token_ids": stops}
        bias = sampling.get("logit_bias") or {}
        vocab = len(self.tito.tokenizer) if bias else 0
        outside = [t for t in bias if int(t) >= vocab]
        if outside:
            raise BadRequest(
                f"logit_bias names token {outside[0]}, outside the tokenizer's vocabulary "
                f"[0, {vocab})",
                param="logit_bias",
            )
        constraint = engine_constraint(
            request,
            family=self.tito.parser_family or self.config.tito_model,
            thinking=self.tito.thinking(turn.state.chat_template_kwargs),
        )
        if constraint is not None:
            sampling[constraint.key] = constraint.value
        if sampling.get("max_new_tokens") is None:
            sampling["max_new_tokens"] = default_budget(
                self.config.default_max_tokens, turn.prompt.length, context
            )
        await self.forwarded.verified(sampling)  # a router must not drop the constraint
        return sampling

    def _keep_partial(self, session_id: str, request: ChatRequest) -> bool:
        """The rollout asked this call to keep its partial output (header or session flag)."""
        if request.partial_rollout:
            return True
        record = self.store.sessions.get(session_id)
        return record is not None and record.partial_rollout

    async def _record(
        self,
        session: OpenSession,
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
        gone = request.client_gone
        unanswered = generation.client_gone or (gone is not None and gone.is_set())
        # An answer the agent never received ends the segment as an abort, whatever the engine
        # said: the agent will go on from a history without it.
        finish = "abort" if unanswered else finish_reason(generation, message)
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
                extra=step_extra(self.config, turn, request, generation, error, unanswered),
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
        if unanswered:
            self.counters["client_disconnected"] += 1
            await self.store.mark_no_grad(
                session.id,
                f"step {step.step_index} ({completion_id}): the client disconnected before the "
                f"answer; its {len(generation.output_ids)} generated tokens were never delivered",
            )
        return ChatResult(
            completion_id=completion_id,
            message=message,
            finish_reason=finish,
            prompt_tokens=prompt_end,
            completion_tokens=len(generation.output_ids),
            cached_tokens=generation.cached_tokens,
            weight_version=str(generation.recorded_version),  # what the step records
            step=step,
            logprobs=(
                token_logprobs(
                    self.tito, generation.output_ids, generation.logprobs, generation.top_logprobs
                )
                if request.logprobs
                else None
            ),
        )

    async def _keep_interrupted(
        self,
        session: OpenSession,
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

    async def _check_no_grad(self, session: OpenSession, generation: Generation) -> None:
        """The pause cap ended this call (its step is recorded): mark the trajectory, fail."""
        if generation.no_grad_reason:
            await self.store.mark_no_grad(session.id, generation.no_grad_reason)
            self.counters["pause_cap_exceeded"] += 1
            raise PauseCapExceeded(generation.no_grad_reason)

    async def chat(self, session_id: str, request: ChatRequest) -> ChatResult:
        """One non-streaming chat call, recorded before it returns."""
        session = self._open_for_call(session_id)
        async with session.lock:
            if session.closed:
                raise SessionClosed(f"session {session_id} was finalized or discarded")
            started = time.time()
            turn, context = await self._begin(session, request)
            completion_id = new_completion_id()
            try:
                try:
                    generation = await self.controller.generate(
                        session_id,
                        turn.prompt,
                        await self._sampling(request, turn, context),
                        request_id=completion_id,
                        keep_partial=self._keep_partial(session_id, request),
                        client_gone=request.client_gone,
                        top_logprobs=request.top_logprobs,
                    )
                except (EngineError, PauseCapExceeded) as exc:
                    await self._keep_interrupted(
                        session, turn, request, exc, completion_id, started
                    )
                    raise
                _refuse_if_nothing_to_keep(session_id, generation)
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
            turn, context = await self._begin(session, request)
            completion_id = new_completion_id()
            splitter = StreamSplitter(
                self._stream_format,
                thinking=self.tito.thinking(turn.state.chat_template_kwargs),
                stops=request.sampling.get("stop") or (),
            )
            decoder = IncrementalDecoder(self.tito.decode)
            sampling = await self._sampling(request, turn, context)
            if self.config.stream_interval is not None:  # --stream-interval
                sampling.setdefault("stream_interval", self.config.stream_interval)
            try:
                deltas = self.controller.generate_stream(
                    session_id,
                    turn.prompt,
                    sampling,
                    request_id=completion_id,
                    keep_partial=self._keep_partial(session_id, request),
                    client_gone=request.client_gone,
                    top_logprobs=request.top_logprobs,
                )
                pending: list[dict[str, Any]] = []
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
                            if request.logprobs:
                                pending += token_logprobs(
                                    self.tito, delta.output_ids, delta.logprobs, delta.top_logprobs
                                )
                            fields = splitter.push(decoder.push(delta.output_ids))
                            if fields:
                                yield StreamDelta(fields, pending or None)
                                pending = []
                    except (EngineError, PauseCapExceeded) as exc:
                        await self._keep_interrupted(
                            session, turn, request, exc, completion_id, started
                        )
                        raise
                assert generation is not None
                _refuse_if_nothing_to_keep(session_id, generation)
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
            yield StreamEnd(result, closing, pending if request.logprobs else None)


def _refuse_if_nothing_to_keep(session_id: str, generation: Generation) -> None:
    """The agent left before anything was generated: no step, a 499 nobody reads."""
    if generation.client_gone and not generation.output_ids:
        raise ClientClosedRequest(
            f"session {session_id}: the client closed the connection before any token was "
            "generated; nothing was recorded"
        )
