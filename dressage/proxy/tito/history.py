"""Append-only checks: does a request extend a segment, or must it open a new one?

A request carries the agent's whole message list. It extends the segment when it starts with the
segment's messages (sampled assistant messages compared tolerantly, see
:func:`~dressage.proxy.tito.messages.assistant_difference`) and the tools and template kwargs that
shaped the history are unchanged. Anything else is a :class:`SegmentBoundary` with its reason.

Cost: one C-level list equality against the forms the previous request carried, so an unchanged
history costs microseconds; the per-message walk runs only when something differs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from dressage.proxy.tito.messages import assistant_difference, content_text
from dressage.proxy.tito.state import BoundaryReason, SegmentBoundary, TITOInputError, TITOState

__all__ = ["AppendOk", "check_append"]


@dataclass(frozen=True)
class AppendOk:
    first_new: int
    """Index of the first appended message."""
    echo_updates: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """Messages accepted as equivalent to the recorded ones: the form to expect next time."""


def _tool_names(tools: Sequence[Any] | None) -> list[str]:
    names = []
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        names.append(str(function.get("name") if isinstance(function, dict) else tool))
    return names


def _tools_boundary(old: Any, new: Any) -> SegmentBoundary | None:
    if (old or None) == (new or None):
        return None
    before, after = _tool_names(old), _tool_names(new)
    if before == after:
        detail = f"tool schemas changed (same names: {after})"
    else:
        detail = f"tools changed from {before} to {after}"
    return SegmentBoundary(BoundaryReason.TOOLS_CHANGED, detail)


def _kwargs_boundary(
    old: dict[str, Any], new: dict[str, Any], prompt_only: Collection[str]
) -> SegmentBoundary | None:
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    changed = [k for k in changed if k not in prompt_only]
    if not changed:
        return None
    return SegmentBoundary(
        BoundaryReason.TEMPLATE_KWARGS_CHANGED,
        f"chat_template_kwargs {changed} changed: "
        f"{ {k: old.get(k) for k in changed} } -> { {k: new.get(k) for k in changed} }",
    )


def _same_plain(new: dict[str, Any], old: dict[str, Any], i: int) -> bool:
    """A non-sampled message is unchanged if only its content's spelling (str vs parts) differs."""
    if {k: v for k, v in new.items() if k != "content"} != {
        k: v for k, v in old.items() if k != "content"
    }:
        return False
    try:
        return content_text(new, i) == content_text(old, i)
    except TITOInputError:
        return False


def _message_boundary(state: TITOState, new: Any, i: int) -> SegmentBoundary | AppendOk:
    old = state.messages[i]
    new_role = new.get("role") if isinstance(new, dict) else None
    if new_role != old["role"]:
        if i == 0 and "system" in (new_role, old["role"]):
            detail = f"message 0: system prompt {'added' if new_role == 'system' else 'removed'}"
            return SegmentBoundary(BoundaryReason.SYSTEM_CHANGED, detail, i)
        return SegmentBoundary(
            BoundaryReason.MESSAGES_REMOVED,
            f"message {i} is {new_role!r} where the segment has {old['role']!r}: "
            "messages were removed or reordered",
            i,
        )
    if state.sampled[i]:
        difference = assistant_difference(new, old, i)
        if difference is None:
            return AppendOk(i, [(i, new)])
        return SegmentBoundary(BoundaryReason.ASSISTANT_MISMATCH, difference, i)
    if _same_plain(new, old, i) or (
        old["role"] == "assistant" and assistant_difference(new, old, i) is None
    ):
        return AppendOk(i, [(i, new)])
    if old["role"] == "system" and i == 0:
        return SegmentBoundary(BoundaryReason.SYSTEM_CHANGED, "message 0: system prompt edited", i)
    return SegmentBoundary(
        BoundaryReason.MESSAGE_REWRITTEN, f"message {i} ({old['role']}) was edited", i
    )


def check_append(
    state: TITOState,
    messages: Sequence[Any],
    tools: Sequence[Any] | None,
    kwargs: dict[str, Any],
    *,
    prompt_only_kwargs: Collection[str] = (),
) -> AppendOk | SegmentBoundary:
    """Where ``messages`` start appending to ``state``, or why they cannot."""
    boundary = _tools_boundary(state.tools, tools) or _kwargs_boundary(
        state.chat_template_kwargs, kwargs, prompt_only_kwargs
    )
    if boundary is not None:
        return boundary
    n = len(state.messages)
    if len(messages) < n:
        return SegmentBoundary(
            BoundaryReason.MESSAGES_REMOVED,
            f"the request has {len(messages)} messages, the segment {n}: messages were removed",
        )
    if list(messages[:n]) == state.echoes:
        return AppendOk(n)
    updates: list[tuple[int, dict[str, Any]]] = []
    for i in range(n):
        if messages[i] == state.echoes[i]:
            continue
        result = _message_boundary(state, messages[i], i)
        if isinstance(result, SegmentBoundary):
            return result
        updates.extend(result.echo_updates)
    return AppendOk(n, updates)
