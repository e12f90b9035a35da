"""The records TITO keeps and returns: segment state, turns, and segment boundaries.

Re-exported from :mod:`dressage.proxy.tito.tito_tokenizer`, where the proxy imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["BoundaryReason", "SegmentBoundary", "TITOInputError", "TITOState", "TITOTurn"]


class BoundaryReason(StrEnum):
    """Why a request cannot extend the current segment (recorded on the new segment's 1st step)."""

    MESSAGE_REWRITTEN = "message_rewritten"
    MESSAGES_REMOVED = "messages_removed"
    """Fewer messages than the segment holds, or messages reordered (compaction)."""
    TOOLS_CHANGED = "tools_changed"
    SYSTEM_CHANGED = "system_changed"
    ASSISTANT_MISMATCH = "assistant_mismatch"
    """An echoed assistant message is not what was sampled."""
    RENDER_FAILED = "render_failed"
    TEMPLATE_KWARGS_CHANGED = "template_kwargs_changed"
    """``chat_template_kwargs`` changed in a way that would re-render history."""
    OUTPUT_NOT_RECORDED = "output_not_recorded"
    """New messages arrived while the previous generation has no recorded output."""
    TEMPLATE_PREFIX_MISMATCH = "template_prefix_mismatch"
    """Generic mode: the new render does not start with what the segment already holds."""
    RETOKENIZATION_DRIFT = "retokenization_drift"
    """Snapshot mode: re-tokenizing the conversation changed ids that were already sent."""


@dataclass(frozen=True)
class SegmentBoundary:
    """The request must start a new segment (``TITOTokenizer.start``) for this reason."""

    reason: BoundaryReason
    detail: str
    message_index: int | None = None


class TITOInputError(ValueError):
    """A request no segment can hold: unknown role, unrenderable content, orphan tool message.

    The proxy answers it with HTTP 400; the message names the offending index, role and value.
    """


@dataclass(eq=False)
class TITOState:
    """One segment so far. ``extend`` and ``record_output`` update it in place and return it.

    ``ids`` are exactly the ids sent to and produced by the engine, in order; ``loss_mask`` is 1
    on sampled ids and 0 elsewhere. ``messages[i]`` is the message those ids hold at index ``i``
    (an assistant message as the proxy returned it when ``sampled[i]``); ``echoes[i]`` is the form
    the latest request carried, so an unchanged history is recognised by plain equality.
    """

    ids: list[int]
    loss_mask: list[int]
    messages: list[dict[str, Any]]
    echoes: list[dict[str, Any]]
    sampled: list[bool]
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    awaiting_output: bool = True
    """The ids end in a generation prompt whose output is not recorded yet."""
    open_turn: bool = False
    """The last output stopped without the family's turn closer (added before the next turn)."""
    text: str | None = None
    """Generic mode only: the text that ``ids`` render (prompt renders plus decoded outputs)."""

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def copy(self) -> TITOState:
        """An independent copy (states are updated in place; copy one to branch from it)."""
        return TITOState(
            ids=list(self.ids),
            loss_mask=list(self.loss_mask),
            messages=list(self.messages),
            echoes=list(self.echoes),
            sampled=list(self.sampled),
            tools=self.tools,
            chat_template_kwargs=dict(self.chat_template_kwargs),
            awaiting_output=self.awaiting_output,
            open_turn=self.open_turn,
            text=self.text,
        )


@dataclass(frozen=True)
class TITOTurn:
    """What one request appends before generation (all mask 0), and the state after it.

    ``delta_ids`` hold, in order: a turn closer the last output lacked, the appended messages,
    and the generation prompt. For ``start`` they are the whole prompt.
    """

    delta_ids: list[int]
    state: TITOState

    @property
    def prefix_length(self) -> int:
        """Length of the segment before this turn's delta."""
        return len(self.state.ids) - len(self.delta_ids)
