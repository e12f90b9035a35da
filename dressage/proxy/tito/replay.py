"""Replay a scripted agent conversation through a token builder, recording what the engine saw.

The engine is scripted: each turn's output is given as the pieces the model sampled (each piece
becomes the ids it encodes to on its own, a ``bytes`` piece becomes raw byte tokens), followed by
the turn closer unless the turn was cut off. The agent is scripted too: after each turn it echoes
the assistant message back (possibly reformatted, as agents do) and appends the next messages.

:func:`replay_tito` drives a :class:`~dressage.proxy.tito.base.TITOTokenizer`; :func:`replay_naive`
re-renders and re-tokenizes the agent's conversation every turn, as a proxy without TITO does.
:func:`drift_turns` counts the calls whose prompt does not extend the previous call's prompt and
output: every such call silently changes ids that were already sent (and trained on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dressage.proxy.tito.base import TITOTokenizer
from dressage.proxy.tito.state import SegmentBoundary, TITOState

__all__ = [
    "EngineCall",
    "Replay",
    "ScriptedConversation",
    "ScriptedTurn",
    "drift_turns",
    "replay_naive",
    "replay_tito",
    "sampled_ids",
]

Echo = Callable[[dict[str, Any]], dict[str, Any]]
Piece = str | bytes


@dataclass
class ScriptedTurn:
    pieces: list[Piece]
    """The sampled output, piece by piece (a model's tokenization need not be the canonical one)."""
    stopped: bool = True
    """Ended with the turn closer token; False: cut off (a length stop) without it."""
    follow_up: list[dict[str, Any]] = field(default_factory=list)
    """Messages the agent appends after echoing this turn's assistant message."""


@dataclass
class ScriptedConversation:
    name: str
    category: str
    messages: list[dict[str, Any]]
    turns: list[ScriptedTurn]
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    echo: Echo | None = None
    """How the agent sends an assistant message back (None: verbatim)."""


@dataclass(frozen=True)
class EngineCall:
    input_ids: list[int]
    output_ids: list[int]


@dataclass
class Replay:
    calls: list[EngineCall]
    boundaries: list[SegmentBoundary]
    state: TITOState | None = None


def _byte_token_ids(tito: TITOTokenizer, data: bytes) -> list[int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    tokens = [table[b] for b in data]
    ids = tito.tokenizer.convert_tokens_to_ids(tokens)
    return [ids] if isinstance(ids, int) else [int(i) for i in ids]


def sampled_ids(tito: TITOTokenizer, turn: ScriptedTurn) -> list[int]:
    """The ids the scripted model samples in ``turn``."""
    ids: list[int] = []
    for piece in turn.pieces:
        ids.extend(_byte_token_ids(tito, piece) if isinstance(piece, bytes) else tito.encode(piece))
    if turn.stopped:
        ids.append(min(tito.closer_ids))
    return ids


def replay_tito(tito: TITOTokenizer, conv: ScriptedConversation) -> Replay:
    """Run ``conv`` through TITO; a boundary restarts the segment, rendering the request whole."""
    turn = tito.start(
        conv.messages, tools=conv.tools, chat_template_kwargs=conv.chat_template_kwargs
    )
    state, messages = turn.state, list(conv.messages)
    calls: list[EngineCall] = []
    boundaries: list[SegmentBoundary] = []
    for scripted in conv.turns:
        output = sampled_ids(tito, scripted)
        calls.append(EngineCall(list(state.ids), output))
        message = tito.parse_output(state, output).to_message()
        state = tito.record_output(state, output, assistant_message=message)
        messages = messages + [conv.echo(message) if conv.echo else message, *scripted.follow_up]
        step = tito.extend(
            state, messages, tools=conv.tools, chat_template_kwargs=conv.chat_template_kwargs
        )
        if isinstance(step, SegmentBoundary):
            boundaries.append(step)
            step = tito.start(
                messages, tools=conv.tools, chat_template_kwargs=conv.chat_template_kwargs
            )
        state = step.state
    return Replay(calls, boundaries, state)


def replay_naive(
    tito: TITOTokenizer,
    conv: ScriptedConversation,
    *,
    rewrite: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
) -> Replay:
    """Re-render the agent's whole conversation every turn and encode all of it.

    ``rewrite`` changes the history before rendering, as a stock template does (for example by
    dropping the reasoning of earlier turns).
    """
    messages = list(conv.messages)
    calls: list[EngineCall] = []
    for scripted in conv.turns:
        view = rewrite(messages) if rewrite else messages
        prompt = tito.encode(
            tito.render_conversation(
                view, tools=conv.tools, chat_template_kwargs=conv.chat_template_kwargs
            )
        )
        output = sampled_ids(tito, scripted)
        calls.append(EngineCall(prompt, output))
        parsed = tito.parse_output(_dummy_state(conv), output).to_message()
        messages = messages + [conv.echo(parsed) if conv.echo else parsed, *scripted.follow_up]
    return Replay(calls, [])


def _dummy_state(conv: ScriptedConversation) -> TITOState:
    return TITOState(
        ids=[],
        loss_mask=[],
        messages=[],
        echoes=[],
        sampled=[],
        tools=conv.tools,
        chat_template_kwargs=conv.chat_template_kwargs,
    )


def drift_turns(calls: Sequence[EngineCall]) -> int:
    """Calls whose prompt does not start with the previous call's prompt followed by its output."""
    drifted = 0
    for before, after in zip(calls, calls[1:], strict=False):
        held = before.input_ids + before.output_ids
        if after.input_ids[: len(held)] != held:
            drifted += 1
    return drifted
