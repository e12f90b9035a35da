"""One chat call over a segment: plan it with TITO, undo it if it fails, read its output.

``plan_turn`` extends the session's segment in place (TITO ``extend``) or, on an append-only
violation, after a restart, or for a session's first call, starts a new segment rendered whole
(TITO ``start``). A call that fails before its step is stored is undone (:meth:`Turn.undo`), so
that the segment is exactly what it was and the agent can retry or go on with other messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dressage.config.proxy import ProxyConfig
from dressage.proxy.engine_client import PromptIds
from dressage.proxy.generation_controller import Generation
from dressage.proxy.openai_api import ChatRequest
from dressage.proxy.tito import SegmentBoundary, TITOState, TITOTokenizer

__all__ = [
    "PROXY_RESTARTED",
    "Turn",
    "TurnMark",
    "assistant_message",
    "finish_reason",
    "plan_turn",
    "step_extra",
    "token_logprobs",
]

PROXY_RESTARTED = "proxy_restarted"
"""Boundary reason of the first segment a session opens after the proxy restarted."""


@dataclass
class TurnMark:
    """Where a TITO state stood before ``extend`` (which updates it in place)."""

    ids: int
    messages: int
    awaiting_output: bool
    open_turn: bool
    kwargs: dict[str, Any]
    text: str | None

    @classmethod
    def of(cls, state: TITOState) -> TurnMark:
        return cls(
            len(state.ids),
            len(state.messages),
            state.awaiting_output,
            state.open_turn,
            state.chat_template_kwargs,
            state.text,
        )

    def restore(self, state: TITOState) -> None:
        del state.ids[self.ids :], state.loss_mask[self.ids :]
        del state.messages[self.messages :], state.echoes[self.messages :]
        del state.sampled[self.messages :]
        state.awaiting_output = self.awaiting_output
        state.open_turn = self.open_turn
        state.chat_template_kwargs = self.kwargs
        state.text = self.text


@dataclass
class Turn:
    """One call's plan: the state it generates from, and how to record or undo it."""

    state: TITOState
    segment: int
    prefix_length: int
    """Tokens of the segment before this call (0: the call opens the segment)."""
    prompt: PromptIds
    """The whole prompt the engine gets."""
    first_message: int
    """Index in ``state.messages`` of the first message this call adds."""
    mark: TurnMark | None
    """Set when ``state`` is the session's own state, extended in place."""
    boundary_reason: str | None = None
    boundary_detail: str = ""
    committed: bool = False
    """The step is written to the store: the call has happened and cannot be undone."""

    def undo(self) -> None:
        if self.mark is not None and not self.committed:
            self.mark.restore(self.state)


def plan_turn(
    tito: TITOTokenizer,
    state: TITOState | None,
    request: ChatRequest,
    *,
    segment: int,
    prompt: PromptIds,
    restarted: bool,
) -> Turn:
    """The turn for ``request`` after ``state`` (the current segment, index ``segment``, whose
    ids ``prompt`` holds). Raises ``TITOInputError`` for messages no segment can hold."""
    tools, kwargs = request.tools, request.chat_template_kwargs
    if state is not None:
        mark = TurnMark.of(state)
        step = tito.extend(state, request.messages, tools=tools, chat_template_kwargs=kwargs)
        if not isinstance(step, SegmentBoundary):
            return Turn(
                state=state,
                segment=segment,
                prefix_length=mark.ids,
                prompt=prompt.extended(step.delta_ids),
                first_message=mark.messages,
                mark=mark,
            )
        reason: str | None = step.reason.value
        detail = step.detail
    elif restarted:
        reason = PROXY_RESTARTED
        detail = "the proxy restarted; the previous segment's TITO state is gone"
    else:
        reason, detail = None, ""
    turn = tito.start(request.messages, tools=tools, chat_template_kwargs=kwargs)
    return Turn(
        state=turn.state,
        segment=segment + 1,
        prefix_length=0,
        prompt=PromptIds.of(turn.delta_ids),
        first_message=0,
        mark=None,
        boundary_reason=reason,
        boundary_detail=detail,
    )


def assistant_message(tito: TITOTokenizer, turn: Turn, generation: Generation) -> dict[str, Any]:
    """The OpenAI assistant message of the output (the family parser's reading)."""
    message = tito.parse_output(turn.state, generation.output_ids).to_message()
    matched = generation.matched_stop
    if isinstance(matched, str) and matched:
        # OpenAI leaves the stop string out of the text; the ids keep it (they were sampled).
        for key in ("content", "reasoning_content"):
            value = message.get(key)
            if isinstance(value, str) and value.endswith(matched):
                message[key] = value[: -len(matched)]
                break
    return message


def finish_reason(generation: Generation, message: dict[str, Any]) -> str:
    """``abort`` and ``length`` as the engine says; else ``tool_calls`` or ``stop``."""
    kind = generation.finish_type
    if kind in ("abort", "length"):
        return kind
    return "tool_calls" if message.get("tool_calls") else "stop"


def step_extra(
    config: ProxyConfig,
    turn: Turn,
    request: ChatRequest,
    gen: Generation,
    error: str | None,
    unanswered: bool,
) -> dict[str, Any]:
    """The step record's ``extra``: how the call ran, and the segment's settings on its first
    step (see :mod:`~dressage.proxy.store`)."""
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
    if unanswered:
        extra["client_disconnected"] = True
    if gen.keep_partial:
        extra["partial_rollout"] = "header" if request.partial_rollout else "session"
    if turn.prefix_length == 0:
        flags = config.segment_flags()
        flags["dressage_partial_rollout"] = config.partial_rollout or gen.keep_partial
        extra["segment"] = {
            "flags": flags,
            "tools": request.tools,
            "chat_template_kwargs": request.chat_template_kwargs,
        }
    if turn.boundary_reason:
        extra["boundary_detail"] = turn.boundary_detail
    return extra


def token_logprobs(
    tito: TITOTokenizer,
    output_ids: list[int],
    logprobs: list[float],
    top_logprobs: list[list[tuple[float, int]]] | None = None,
) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content``: each sampled token, its text, bytes and log-prob (the
    recorded one), with its ``top_logprobs`` candidates when the engine returned them."""
    out = []
    tops = top_logprobs or []
    for i, (token_id, logprob) in enumerate(zip(output_ids, logprobs, strict=True)):
        token = tito.decode([token_id])
        candidates = []
        for top_logprob, top_id in tops[i] if i < len(tops) else ():
            text = tito.decode([top_id])
            candidates.append({"token": text, "logprob": top_logprob, "bytes": list(text.encode())})
        out.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode()),
                "top_logprobs": candidates,
            }
        )
    return out
