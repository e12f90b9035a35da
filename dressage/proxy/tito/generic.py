"""TITO for any chat template: render whole, check the byte prefix, encode only the suffix.

For a model without a pinned template, the tokenizer's own ``chat_template`` renders the whole
conversation each turn (through ``apply_chat_template``). The segment remembers the text its ids
stand for (each prompt render plus each decoded output). When the new render starts with that
text, only the rest is encoded; when it does not (the template re-rendered history, say by
dropping earlier reasoning), the request opens a new segment with ``template_prefix_mismatch``.
Rendering is O(history) per turn here; encoding stays O(delta).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dressage.proxy.tito.base import TITOTokenizer
from dressage.proxy.tito.formats import FORMATS
from dressage.proxy.tito.history import AppendOk
from dressage.proxy.tito.messages import validate_messages
from dressage.proxy.tito.snapshot import first_difference
from dressage.proxy.tito.state import (
    BoundaryReason,
    SegmentBoundary,
    TITOInputError,
    TITOState,
    TITOTurn,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["GenericTITOTokenizer"]


def _hf_form(message: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as mappings: what Hugging Face chat templates iterate over."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for call in calls:
        function = dict(call.get("function") or {})
        if isinstance(function.get("arguments"), str):
            function["arguments"] = json.loads(function["arguments"] or "{}")
        converted.append({**call, "function": function})
    return {**message, "tool_calls": converted}


class GenericTITOTokenizer(TITOTokenizer):
    """Prefix-checked TITO over ``chat_template`` (default: the tokenizer's own)."""

    family = "generic"

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        parser: str | None = None,
    ) -> None:
        super().__init__(tokenizer)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise ValueError("generic TITO needs a chat template: the tokenizer has none")
        self._parser = parser
        eos = tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.stop_token_ids = [int(i) for i in ids]
        self.closer_ids = frozenset(self.stop_token_ids)

    @property
    def parser_family(self) -> str | None:
        return self._parser

    def thinking(self, chat_template_kwargs: dict[str, Any]) -> bool | None:
        # A parser named after a known family reads the generation prompt as that family does.
        fmt = FORMATS.get(self._parser or "")
        return fmt.thinking(chat_template_kwargs) if fmt else None

    def render_conversation(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        validate_messages(messages)
        hf_tools: Any = tools
        try:
            text = self.tokenizer.apply_chat_template(
                [_hf_form(m) for m in messages],
                tools=hf_tools,
                chat_template=self.chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(chat_template_kwargs or {}),
            )
        except Exception as exc:  # a foreign template may fail in any way; report it as input
            raise TITOInputError(f"generic: the chat template failed: {exc}") from exc
        return str(text)

    def start(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> TITOTurn:
        kwargs = dict(chat_template_kwargs or {})
        text = self.render_conversation(messages, tools=tools, chat_template_kwargs=kwargs)
        ids = self.encode(text)
        state = self._new_state(messages, ids, tools, kwargs, text=text)
        return TITOTurn(delta_ids=list(ids), state=state)

    def _after_output(self, state: TITOState, output_ids: list[int]) -> None:
        state.text = (state.text or "") + self.decode(output_ids)

    def _append(
        self,
        state: TITOState,
        messages: Sequence[dict[str, Any]],
        check: AppendOk,
        *,
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> TITOTurn | SegmentBoundary:
        first = check.first_new
        validate_messages(messages, first)
        # History renders from what the segment holds (sampled messages as returned, reasoning
        # included), the new messages as the request sent them.
        conversation = state.messages[:first] + list(messages[first:])
        try:
            text = self.render_conversation(conversation, tools=tools, chat_template_kwargs=kwargs)
        except TITOInputError as exc:
            return SegmentBoundary(BoundaryReason.RENDER_FAILED, str(exc), first)
        held = state.text or ""
        if not text.startswith(held):
            k = first_difference(held, text)
            return SegmentBoundary(
                BoundaryReason.TEMPLATE_PREFIX_MISMATCH,
                f"the new render differs from the segment's text at character {k}: "
                f"held {held[k : k + 40]!r}, rendered {text[k : k + 40]!r}",
            )
        delta = self.encode(text[len(held) :])
        turn = self._commit(state, messages, first, check.echo_updates, delta, kwargs)
        state.text = text
        return turn
