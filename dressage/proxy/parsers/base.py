"""What a parser returns, and the pieces every family's parser shares.

A parser turns the text a model sampled into the OpenAI assistant message the proxy returns to the
agent. It never raises on model output: text it cannot read as a tool call stays plain content.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ParsedOutput", "ParsedToolCall", "new_call_id", "split_reasoning", "strip_terminators"]


def new_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` + 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {
                "name": self.name,
                "arguments": json.dumps(self.arguments, ensure_ascii=False),
            },
        }


@dataclass(frozen=True)
class ParsedOutput:
    """The assistant message read from one sampled output.

    ``content`` is ``None`` only when the output is nothing but tool calls (as the OpenAI API
    returns it); ``reasoning_content`` is ``None`` when the output carries no reasoning block.
    """

    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)

    @property
    def finish_reason_hint(self) -> str | None:
        """``"tool_calls"`` when the output ends in tool calls; the engine's reason otherwise."""
        return "tool_calls" if self.tool_calls else None

    def to_message(self) -> dict[str, Any]:
        """The OpenAI ``assistant`` message (keys with no value are left out)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


def strip_terminators(text: str, terminators: tuple[str, ...]) -> str:
    """Drop turn-ending tokens the engine left at the end of the text (the stop token)."""
    changed = True
    while changed:
        changed = False
        for term in terminators:
            if term and text.endswith(term):
                text = text[: -len(term)]
                changed = True
    return text


def split_reasoning(
    text: str,
    *,
    open_tag: str,
    close_tag: str,
    thinking: bool | None,
    pad: str = "",
    after: str = "",
) -> tuple[str | None, str]:
    """Split ``text`` into (reasoning, rest).

    ``thinking`` tells whether the generation prompt already opened a reasoning block (then the
    output starts inside it and may lack the open tag). ``pad`` is the newline the format puts
    inside the tags and ``after`` what it puts after the close tag: exactly one of each is removed,
    so rendering the parsed message gives back the sampled text.
    """
    body = text
    if text.startswith(open_tag):
        body = text[len(open_tag) :]
        opened = True
    else:
        opened = bool(thinking)
    end = body.find(close_tag)
    if end < 0:
        if not opened:
            return None, text
        # Output cut off inside the reasoning block: all of it is reasoning.
        return _trim(body, pad, tail=False), ""
    reasoning = _trim(body[:end], pad, tail=True)
    rest = body[end + len(close_tag) :]
    if after and rest.startswith(after):
        rest = rest[len(after) :]
    return reasoning, rest


def _trim(text: str, pad: str, *, tail: bool) -> str:
    if pad and text.startswith(pad):
        text = text[len(pad) :]
    if tail and pad and text.endswith(pad):
        text = text[: -len(pad)]
    return text
