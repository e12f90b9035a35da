"""Model output → OpenAI assistant message, one parser per chat family.

    from dressage.proxy.parsers import parse_assistant_output
    parsed = parse_assistant_output(text, family="qwen3.5", tools=request_tools, thinking=True)
    message = parsed.to_message()      # {"role": "assistant", "content", "reasoning_content", ...}

Each parser is the inverse of the family's pinned template in ``dressage/proxy/tito/templates``;
tool calls it cannot read stay plain content, and no parser raises on model output.
"""

from __future__ import annotations

from typing import Any, Protocol

from dressage.proxy.parsers.base import ParsedOutput, ParsedToolCall, new_call_id
from dressage.proxy.parsers.deepseek import parse_deepseek
from dressage.proxy.parsers.llama3 import parse_llama3
from dressage.proxy.parsers.qwen import parse_qwen3, parse_qwen35

__all__ = [
    "PARSERS",
    "OutputParser",
    "ParsedOutput",
    "ParsedToolCall",
    "new_call_id",
    "parse_assistant_output",
    "register_parser",
]


class OutputParser(Protocol):
    def __call__(
        self, text: str, *, tools: list[dict[str, Any]] | None = ..., thinking: bool | None = ...
    ) -> ParsedOutput: ...


PARSERS: dict[str, OutputParser] = {
    "qwen3.5": parse_qwen35,
    "qwen3": parse_qwen3,
    "llama3": parse_llama3,
    "deepseek": parse_deepseek,
}


def register_parser(family: str, parser: OutputParser) -> None:
    """Add a family's parser (a name already taken raises, so nothing is replaced by accident)."""
    if family in PARSERS:
        raise ValueError(f"a parser for family {family!r} is already registered")
    PARSERS[family] = parser


def parse_assistant_output(
    text: str,
    *,
    family: str,
    tools: list[dict[str, Any]] | None = None,
    thinking: bool | None = None,
) -> ParsedOutput:
    """Parse sampled ``text`` (decoded with special tokens kept) of a ``family`` model.

    ``thinking`` says how the generation prompt ended: True if it opened a reasoning block,
    False if it closed an empty one, None if unknown (then a leading block is still found).
    """
    try:
        parser = PARSERS[family]
    except KeyError:
        raise ValueError(
            f"no output parser for family {family!r}; known: {sorted(PARSERS)}"
        ) from None
    return parser(text, tools=tools, thinking=thinking)
