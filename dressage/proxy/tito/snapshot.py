"""The snapshot build mode (``--token-build-mode snapshot``): re-render and re-tokenize each turn.

Every request renders the whole conversation and encodes all of it. When the new ids start with
the ids the segment already holds, the delta is the rest; when they do not, the conversation has
drifted (a sampled tokenization that text cannot reproduce, a template that re-renders history)
and the request opens a new segment with ``retokenization_drift``. It is the baseline TITO is
measured against, and the fallback where TITO cannot apply. Its cost grows with the history.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from dressage.proxy.tito.base import TITOTokenizer
from dressage.proxy.tito.history import AppendOk
from dressage.proxy.tito.state import BoundaryReason, SegmentBoundary, TITOState, TITOTurn

__all__ = ["SnapshotTITOTokenizer", "first_difference"]


def first_difference(old: Sequence[Any], new: Sequence[Any]) -> int:
    """Index of the first position where ``new`` stops extending ``old`` (len(old) if never)."""
    for k, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return k
    return min(len(old), len(new))


class SnapshotTITOTokenizer(TITOTokenizer):
    """Whole re-tokenization each turn, over another mode's renderer (a family or generic)."""

    def __init__(self, inner: TITOTokenizer) -> None:
        super().__init__(inner.tokenizer)
        self.inner = inner
        self.family = inner.family
        self.stop_token_ids = inner.stop_token_ids
        self.closer_ids = inner.closer_ids

    @property
    def prompt_only_kwargs(self) -> Collection[str]:
        return self.inner.prompt_only_kwargs

    @property
    def parser_family(self) -> str | None:
        return self.inner.parser_family

    def thinking(self, chat_template_kwargs: dict[str, Any]) -> bool | None:
        return self.inner.thinking(chat_template_kwargs)

    def render_conversation(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        return self.inner.render_conversation(
            messages,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            add_generation_prompt=add_generation_prompt,
        )

    def start(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> TITOTurn:
        return self.inner.start(messages, tools=tools, chat_template_kwargs=chat_template_kwargs)

    def record_output(
        self, state: TITOState, output_ids: Sequence[int], *, assistant_message: dict[str, Any]
    ) -> TITOState:
        return self.inner.record_output(state, output_ids, assistant_message=assistant_message)

    def _append(
        self,
        state: TITOState,
        messages: Sequence[dict[str, Any]],
        check: AppendOk,
        *,
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> TITOTurn | SegmentBoundary:
        text = self.render_conversation(messages, tools=tools, chat_template_kwargs=kwargs)
        ids = self.encode(text)
        n = len(state.ids)
        if ids[:n] != state.ids:
            k = first_difference(state.ids, ids)
            return SegmentBoundary(
                BoundaryReason.RETOKENIZATION_DRIFT,
                f"re-tokenizing the conversation changes token {k} of {n}: sent "
                f"{state.ids[k : k + 4]}, now {ids[k : k + 4]} "
                f"({self.decode(state.ids[k : k + 4])!r} vs {self.decode(ids[k : k + 4])!r})",
            )
        turn = self._commit(state, messages, check.first_new, check.echo_updates, ids[n:], kwargs)
        if state.text is not None:
            state.text = text
        return turn
