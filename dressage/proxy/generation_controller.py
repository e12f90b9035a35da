"""One agent call's engine requests, continued across pauses (the pause itself: pause_controller).

Every engine call of the proxy goes through :class:`GenerationController`. One agent call is one
*generation*: the prompt's ids go to the engine and the sampled ids come back with a log-prob and a
weight version each. A generation may take several engine requests: when a request ends in ``abort``
and the :class:`ResumePolicy` says the abort was the proxy's own pause (a weight update), the
controller waits as the policy says, then asks again with ``prompt + partial output`` as the prompt
and the remaining token budget, and appends what comes back. The agent's HTTP call sees one answer;
each token keeps the version that produced it::

    controller = GenerationController(engine)
    generation = await controller.generate(session_id, prompt, sampling, request_id="r1")
    generation.output_ids, generation.logprobs, generation.versions, generation.finish_type

Two seams, both filled by :class:`~dressage.proxy.pause_controller.PauseController` in the server:

- a :class:`GenerationGate` is asked before every engine request (``admit``: it may hold the
  request while the proxy is paused, or refuse it) and told when the request came back;
- a :class:`ResumePolicy` decides what an ``abort`` means. :class:`NeverResume` (the default
  without a gate) makes it final: the partial output comes back with ``finish_type == "abort"``.
  A policy may call :meth:`Generation.discard_partial` before saying yes, to start the call
  again from its prompt instead of continuing it. A call made with ``keep_partial=True`` (the
  rollout asked partial rollout of it, see :mod:`~dressage.proxy.sessions`) carries that on its
  :class:`Generation` for the policy to honour.

If the engine fails after part of the output was produced, the :class:`EngineError` carries
that partial generation (``partial_generation``) so that the session can record it.

A call may carry ``client_gone``, an event the server sets when the agent's connection closes.
From then on the controller asks the engine to abort the call's request (the engine answers with
what it had generated, finish ``abort``), starts no further engine request, stops waiting for a
pause to end, and never resumes: the generation comes back with ``client_gone`` set, for the
session to record as unanswered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx

from dressage.proxy.engine_answers import EngineError, EngineOutput, parse_version
from dressage.proxy.engine_client import EngineClient, PromptIds

__all__ = [
    "Generation",
    "GenerationController",
    "GenerationDelta",
    "GenerationGate",
    "GoneSignal",
    "NeverResume",
    "OpenGate",
    "ResumePolicy",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class Generation:
    """What the engine produced for one agent call, over however many engine requests."""

    request_id: str
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    """The last engine request's ``finish_reason`` object."""
    weight_version: str = ""
    """The engine's weight version at the last request."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    engine_requests: int = 0
    epoch: int = 0
    """The gate's pause count when the current engine request was admitted."""
    pauses: int = 0
    """Rollout pauses this call was stopped by and resumed after."""
    discarded_tokens: int = 0
    """Tokens produced and then dropped (a pause without partial rollout restarts the call)."""
    streamed: bool = False
    """Tokens have been sent to the agent already (a streamed call cannot restart)."""
    no_grad_reason: str | None = None
    """Set by a policy that ends the call for good: the trajectory must train nothing."""
    keep_partial: bool = False
    """The rollout asked this call to keep its partial output across a rollout pause (the
    policy's own switch, ``--dressage-partial-rollout``, covers every call)."""
    client_gone: bool = False
    """The agent's connection closed during the call: the engine was asked to abort it and
    nothing of it reaches the agent."""
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    """Per output token, the engine's most likely tokens (when the call asked for them)."""

    @property
    def finish_type(self) -> str:
        """``stop``, ``length`` or ``abort`` (an engine answer without a reason reads ``abort``)."""
        return str(self.finish.get("type")) if self.finish else "abort"

    @property
    def matched_stop(self) -> int | str | None:
        if self.finish and self.finish.get("type") == "stop":
            matched = self.finish.get("matched")
            return matched if isinstance(matched, int | str) else None
        return None

    @property
    def recorded_version(self) -> int:
        """The weight version recorded for the call's last output token (the step's
        ``output_versions``): the engine's ``weight_version`` read as an int, so SGLang's
        ``"default"`` is 0 (see :func:`~dressage.proxy.engine_answers.parse_version`)."""
        return self.versions[-1] if self.versions else parse_version(self.weight_version)

    def add(self, out: EngineOutput) -> None:
        self.output_ids += out.output_ids
        self.logprobs += out.logprobs
        self.versions += out.versions
        self.top_logprobs += out.top_logprobs
        if out.finish is not None:
            self.finish = out.finish
        if out.weight_version:
            self.weight_version = out.weight_version
        if self.prompt_tokens is None:  # the first request's prompt is the agent's prompt
            self.prompt_tokens = out.prompt_tokens
            self.cached_tokens = out.cached_tokens

    def discard_partial(self) -> None:
        """Drop what was generated so far: the next engine request starts from the prompt."""
        self.discarded_tokens += len(self.output_ids)
        self.output_ids, self.logprobs, self.versions = [], [], []
        self.top_logprobs = []
        self.finish = None


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    """Streaming: the tokens of one engine chunk; the last delta of a generation has ``done``."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    done: Generation | None = None
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)


class ResumePolicy(Protocol):
    async def should_resume(self, session_id: str, generation: Generation) -> bool:
        """Called when a request ended in ``abort``: True to continue the same generation
        (after waiting for whatever caused the abort), False to return it as aborted."""
        ...


class GoneSignal(asyncio.Event):
    """A call's ``client_gone`` event that also runs callbacks once set: what waits for a
    disconnect registers a callback instead of starting a task per call to ``wait()`` for it.

        gone = GoneSignal()
        remove = gone.on_set(lambda: print("the agent left"))   # remove() when done waiting
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the event is set (at once if it is); returns its remover."""
        if self.is_set():
            callback()
            return _nothing
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove


def _nothing() -> None:
    return None


class GenerationGate(Protocol):
    async def admit(self, session_id: str, generation: Generation) -> None:
        """Before each engine request: wait while generation is held; raise to refuse."""
        ...

    def admit_now(self, session_id: str, generation: Generation) -> bool:
        """:meth:`admit` when nothing holds the request: True when it was admitted at once
        (or refused, raising), False when the caller must ``await admit``. The common case
        then costs no task."""
        ...

    def release(self, generation: Generation) -> None:
        """The engine request admitted last for ``generation`` came back (or failed)."""
        ...

    def forget(self, session_id: str) -> None:
        """The session ended (finalized or discarded)."""
        ...


class NeverResume:
    """Engine aborts are final: the agent gets the partial output with ``finish_reason`` abort."""

    async def should_resume(self, session_id: str, generation: Generation) -> bool:
        return False


class OpenGate:
    """Every engine request goes at once (no pause control)."""

    async def admit(self, session_id: str, generation: Generation) -> None:
        return None

    def admit_now(self, session_id: str, generation: Generation) -> bool:
        return True

    def release(self, generation: Generation) -> None:
        return None

    def forget(self, session_id: str) -> None:
        return None


def _remaining(sampling: dict[str, Any], generated: int) -> dict[str, Any]:
    budget = sampling.get("max_new_tokens")
    if budget is None or generated == 0:
        return sampling
    return {**sampling, "max_new_tokens": max(0, int(budget) - generated)}


class GenerationController:
    """The single place where the proxy generates (see the module docstring)."""

    def __init__(
        self,
        engine: EngineClient,
        *,
        resume_policy: ResumePolicy | None = None,
        gate: GenerationGate | None = None,
    ):
        self.engine = engine
        self.resume_policy: ResumePolicy = resume_policy or NeverResume()
        self.gate: GenerationGate = gate or OpenGate()

    def _rid(self, request_id: str, generation: Generation) -> str:
        # One rid per engine request; all share the call's prefix, so a prefix abort hits all.
        return f"{request_id}-{generation.engine_requests}"

    async def _resume(
        self, session_id: str, generation: Generation, gone: GoneSignal | None
    ) -> bool:
        if generation.finish_type != "abort" or generation.client_gone:
            return False
        resume = await _unless_gone(self.resume_policy.should_resume(session_id, generation), gone)
        if isinstance(resume, _Gone):  # the agent left while the call waited for a pause to end
            generation.client_gone = True
            return False
        return resume

    async def _admit(
        self, session_id: str, generation: Generation, gone: GoneSignal | None
    ) -> bool:
        """Admit the next engine request; False when the agent left first (none is sent)."""
        if gone is not None and gone.is_set():
            generation.client_gone = True
            return False
        if self.gate.admit_now(session_id, generation):
            return True
        if isinstance(await _unless_gone(self.gate.admit(session_id, generation), gone), _Gone):
            generation.client_gone = True
            return False
        return True

    @contextmanager
    def _abort_when_gone(
        self, rid: str, generation: Generation, gone: GoneSignal | None
    ) -> Iterator[None]:
        """While the block runs, a client disconnect aborts engine request ``rid``: the engine
        then ends it with what it has generated, which the block receives as usual."""
        if gone is None:
            yield
            return

        def aborted() -> None:  # a callback, not a task per engine request
            generation.client_gone = True
            self._abort_in_background(rid)

        remove = gone.on_set(aborted)
        try:
            yield
        finally:
            remove()

    async def generate(
        self,
        session_id: str,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        request_id: str,
        keep_partial: bool = False,
        client_gone: GoneSignal | None = None,
        top_logprobs: int = 0,
    ) -> Generation:
        """Generate to a final finish (stop, length, or an abort that is not resumed)."""
        generation = Generation(request_id=request_id, keep_partial=keep_partial)
        while True:
            rid = self._rid(request_id, generation)
            if not await self._admit(session_id, generation, client_gone):
                return generation
            try:
                with self._abort_when_gone(rid, generation, client_gone):
                    out = await self.engine.generate(
                        prompt.extended(generation.output_ids),
                        _remaining(sampling_params, len(generation.output_ids)),
                        rid=rid,
                        routing_key=session_id,
                        top_logprobs=top_logprobs,
                    )
            except asyncio.CancelledError:
                self._abort_in_background(rid)
                raise
            except EngineError as exc:
                _attach_partial(exc, generation)
                raise
            finally:
                self.gate.release(generation)
            generation.engine_requests += 1
            generation.add(out)
            if not await self._resume(session_id, generation, client_gone):
                return generation

    async def generate_stream(
        self,
        session_id: str,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        request_id: str,
        keep_partial: bool = False,
        client_gone: GoneSignal | None = None,
        top_logprobs: int = 0,
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Like :meth:`generate`, yielding tokens as the engine streams them."""
        generation = Generation(request_id=request_id, keep_partial=keep_partial)
        while True:
            rid = self._rid(request_id, generation)
            if not await self._admit(session_id, generation, client_gone):
                yield GenerationDelta([], [], [], done=generation)
                return
            stream = self.engine.generate_stream(
                prompt.extended(generation.output_ids),
                _remaining(sampling_params, len(generation.output_ids)),
                rid=rid,
                routing_key=session_id,
                top_logprobs=top_logprobs,
            )
            finished = False
            try:
                with self._abort_when_gone(rid, generation, client_gone):
                    async for out in stream:
                        generation.add(out)
                        if out.output_ids:
                            generation.streamed = True
                            yield GenerationDelta(
                                out.output_ids,
                                out.logprobs,
                                out.versions,
                                top_logprobs=out.top_logprobs,
                            )
                finished = True
            except EngineError as exc:
                _attach_partial(exc, generation)
                raise
            finally:
                self.gate.release(generation)
                await stream.aclose()
                if not finished:  # the agent went away (or we failed): stop the engine too
                    self._abort_in_background(rid)
            generation.engine_requests += 1
            if not await self._resume(session_id, generation, client_gone):
                yield GenerationDelta([], [], [], done=generation)
                return

    def forget(self, session_id: str) -> None:
        self.gate.forget(session_id)

    async def _abort(self, rid: str) -> None:
        try:
            await self.engine.abort(rid)
        except (EngineError, httpx.HTTPError, ValueError) as exc:
            # Best effort: SGLang also aborts a request whose client went away.
            log.warning("could not abort engine request %s: %r", rid, exc)

    def _abort_in_background(self, rid: str) -> None:
        task = asyncio.get_running_loop().create_task(self._abort(rid))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


class _Gone:
    """What :func:`_unless_gone` returns when the agent left first."""


async def _unless_gone(awaitable: Awaitable[T], gone: GoneSignal | None) -> T | _Gone:
    """``await awaitable``, or :class:`_Gone` (it is cancelled) when ``gone`` is set first."""
    if gone is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        return _Gone()
    return task.result()


def _attach_partial(exc: EngineError, generation: Generation) -> None:
    """Keep what an interrupted generation already produced on the error (see the docstring)."""
    if generation.output_ids and exc.partial_generation is None:
        exc.partial_generation = generation


_BACKGROUND: set[asyncio.Task[None]] = set()
