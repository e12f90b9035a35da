"""Every engine call of the proxy goes through :class:`GenerationController`.

One agent call is one *generation*: the prompt's ids go to the engine and the sampled ids come
back with a log-prob and a weight version each. A generation may take several engine requests:
when a request ends in ``abort`` and the :class:`ResumePolicy` says the abort was the proxy's
own pause (a weight update), the controller waits as the policy says, then asks again with
``prompt + partial output`` as the prompt and the remaining token budget, and appends what comes
back. The agent's HTTP call sees one answer; each token keeps the version that produced it::

    controller = GenerationController(engine)
    generation = await controller.generate(session_id, prompt, sampling, request_id="r1")
    generation.output_ids, generation.logprobs, generation.versions, generation.finish_type

This issue ships :class:`NeverResume`: an engine abort is final, and the partial output comes
back with ``finish_type == "abort"`` (the session records it as such). The partial-rollout
extension provides a policy that knows when the proxy itself paused the engine, and blocks in
``should_resume`` until the pause ends; the loop below already keeps every chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from dressage.proxy.engine_client import EngineClient, EngineError, EngineOutput, PromptIds

__all__ = ["Generation", "GenerationController", "GenerationDelta", "NeverResume", "ResumePolicy"]

log = logging.getLogger(__name__)


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

    def add(self, out: EngineOutput) -> None:
        self.output_ids += out.output_ids
        self.logprobs += out.logprobs
        self.versions += out.versions
        if out.finish is not None:
            self.finish = out.finish
        if out.weight_version:
            self.weight_version = out.weight_version
        if self.prompt_tokens is None:  # the first request's prompt is the agent's prompt
            self.prompt_tokens = out.prompt_tokens
            self.cached_tokens = out.cached_tokens


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    """Streaming: the tokens of one engine chunk; the last delta of a generation has ``done``."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    done: Generation | None = None


class ResumePolicy(Protocol):
    async def should_resume(self, session_id: str, generation: Generation) -> bool:
        """Called when a request ended in ``abort``: True to continue the same generation
        (after waiting for whatever caused the abort), False to return it as aborted."""
        ...


class NeverResume:
    """Engine aborts are final: the agent gets the partial output with ``finish_reason`` abort."""

    async def should_resume(self, session_id: str, generation: Generation) -> bool:
        return False


def _remaining(sampling: dict[str, Any], generated: int) -> dict[str, Any]:
    budget = sampling.get("max_new_tokens")
    if budget is None or generated == 0:
        return sampling
    return {**sampling, "max_new_tokens": max(0, int(budget) - generated)}


class GenerationController:
    """The single place where the proxy generates (see the module docstring)."""

    def __init__(self, engine: EngineClient, *, resume_policy: ResumePolicy | None = None):
        self.engine = engine
        self.resume_policy: ResumePolicy = resume_policy or NeverResume()

    def _rid(self, request_id: str, generation: Generation) -> str:
        # One rid per engine request; all share the call's prefix, so a prefix abort hits all.
        return f"{request_id}-{generation.engine_requests}"

    async def _resume(self, session_id: str, generation: Generation) -> bool:
        if generation.finish_type != "abort":
            return False
        return await self.resume_policy.should_resume(session_id, generation)

    async def generate(
        self,
        session_id: str,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        request_id: str,
    ) -> Generation:
        """Generate to a final finish (stop, length, or an abort that is not resumed)."""
        generation = Generation(request_id=request_id)
        while True:
            rid = self._rid(request_id, generation)
            try:
                out = await self.engine.generate(
                    prompt.extended(generation.output_ids),
                    _remaining(sampling_params, len(generation.output_ids)),
                    rid=rid,
                    routing_key=session_id,
                )
            except asyncio.CancelledError:
                self._abort_in_background(rid)
                raise
            generation.engine_requests += 1
            generation.add(out)
            if not await self._resume(session_id, generation):
                return generation

    async def generate_stream(
        self,
        session_id: str,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        request_id: str,
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Like :meth:`generate`, yielding tokens as the engine streams them."""
        generation = Generation(request_id=request_id)
        while True:
            rid = self._rid(request_id, generation)
            stream = self.engine.generate_stream(
                prompt.extended(generation.output_ids),
                _remaining(sampling_params, len(generation.output_ids)),
                rid=rid,
                routing_key=session_id,
            )
            finished = False
            try:
                async for out in stream:
                    generation.add(out)
                    if out.output_ids:
                        yield GenerationDelta(out.output_ids, out.logprobs, out.versions)
                finished = True
            finally:
                await stream.aclose()
                if not finished:  # the agent went away (or we failed): stop the engine too
                    self._abort_in_background(rid)
            generation.engine_requests += 1
            if not await self._resume(session_id, generation):
                yield GenerationDelta([], [], [], done=generation)
                return

    def _abort_in_background(self, rid: str) -> None:
        async def abort() -> None:
            try:
                await self.engine.abort(rid)
            except (EngineError, httpx.HTTPError, ValueError) as exc:
                # Best effort: SGLang also aborts a request whose client went away.
                log.warning("could not abort engine request %s: %r", rid, exc)

        task = asyncio.get_running_loop().create_task(abort())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[None]] = set()
