"""TITO over a pinned chat template: each turn renders and encodes only the appended messages.

The delta of one turn is: the turn closer when the last output stopped without it, the text the
template writes after a closed assistant turn, the appended messages rendered in ``continuation``
mode by the same template that renders whole conversations, and the generation prompt. It is
encoded alone; ``state.ids`` is never re-encoded, so the cost of a turn is the cost of its delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dressage.proxy.tito.base import TITOTokenizer, single_token_id
from dressage.proxy.tito.formats import ChatFormat
from dressage.proxy.tito.history import AppendOk
from dressage.proxy.tito.messages import template_form, validate_messages
from dressage.proxy.tito.state import (
    BoundaryReason,
    SegmentBoundary,
    TITOInputError,
    TITOState,
    TITOTurn,
)
from dressage.proxy.tito.template_utils import (
    TemplateRenderError,
    compile_template,
    load_pinned_template,
    render_template,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["TemplateTITOTokenizer"]


class TemplateTITOTokenizer(TITOTokenizer):
    """TITO for one chat family (``chat_format``) rendered by its pinned template."""

    chat_format: ChatFormat

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, chat_format: ChatFormat | None = None
    ) -> None:
        super().__init__(tokenizer)
        if chat_format is not None:
            self.chat_format = chat_format
        fmt = self.chat_format
        self.family = fmt.family
        self._template = compile_template(load_pinned_template(fmt.template))
        self.closer_ids = frozenset(
            single_token_id(self.encode, token, fmt.family) for token in fmt.closer_tokens
        )
        self.stop_token_ids = [
            single_token_id(self.encode, token, fmt.family) for token in fmt.stop_tokens
        ]

    @property
    def parser_family(self) -> str | None:
        return self.chat_format.parser

    def thinking(self, chat_template_kwargs: dict[str, Any]) -> bool | None:
        return self.chat_format.thinking(chat_template_kwargs)

    def _render(
        self,
        forms: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
        continuation: bool,
    ) -> str:
        variables = dict(kwargs)
        variables.update(
            messages=forms,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continuation=continuation,
        )
        return render_template(self._template, **variables)

    def render_conversation(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        validate_messages(messages)
        try:
            return self._render(
                template_form(messages),
                tools=tools,
                kwargs=dict(chat_template_kwargs or {}),
                add_generation_prompt=add_generation_prompt,
                continuation=False,
            )
        except TemplateRenderError as exc:
            raise TITOInputError(f"{self.family}: cannot render the conversation: {exc}") from exc

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
        return TITOTurn(delta_ids=list(ids), state=self._new_state(messages, ids, tools, kwargs))

    @property
    def prompt_only_kwargs(self) -> frozenset[str]:
        return self.chat_format.prompt_only_kwargs

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
        fmt = self.chat_format
        prefix = (fmt.turn_closer if state.open_turn else "") + fmt.after_closer
        try:
            body = self._render(
                template_form(messages, first),
                tools=tools,
                kwargs=kwargs,
                add_generation_prompt=True,
                continuation=True,
            )
        except TemplateRenderError as exc:
            return SegmentBoundary(
                BoundaryReason.RENDER_FAILED, f"messages {first}..: {exc}", first
            )
        delta = self.encode(prefix + body)
        return self._commit(state, messages, first, check.echo_updates, delta, kwargs)
