"""DeepSeek (V3.1 style) parser: ``<think>`` reasoning and the tool-call token blocks.

The inverse of ``deepseek_v3_fixed.jinja``::

    <think>REASONING</think>CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>
    {"arg": ...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
"""

from __future__ import annotations

import json
import re
from typing import Any

from dressage.proxy.parsers.base import (
    ParsedOutput,
    ParsedToolCall,
    split_reasoning,
    strip_terminators,
)

__all__ = ["CALLS_BEGIN", "CALLS_END", "CALL_BEGIN", "CALL_END", "TOOL_SEP", "parse_deepseek"]

EOS = "<｜end▁of▁sentence｜>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(TOOL_SEP) + r"(.*?)" + re.escape(CALL_END), re.S
)


def _calls(block: str) -> list[ParsedToolCall] | None:
    calls: list[ParsedToolCall] = []
    pos = 0
    for match in _CALL.finditer(block):
        if block[pos : match.start()].strip():
            return None
        try:
            arguments = json.loads(match.group(2))
        except (ValueError, RecursionError):
            return None
        name = match.group(1).strip()
        if not name or not isinstance(arguments, dict):
            return None
        calls.append(ParsedToolCall(name=name, arguments=arguments))
        pos = match.end()
    if block[pos:].strip():
        return None
    return calls or None


def parse_deepseek(
    text: str, *, tools: list[dict[str, Any]] | None = None, thinking: bool | None = None
) -> ParsedOutput:
    """Parse DeepSeek output. ``thinking=True``: the prompt ended in ``<think>``."""
    text = strip_terminators(text, (EOS,))
    if text.startswith("</think>"):
        # The closing tag alone is the thinking-off marker (it usually ends the prompt).
        return _content_and_calls(None, text[len("</think>") :])
    reasoning, rest = split_reasoning(
        text, open_tag="<think>", close_tag="</think>", thinking=thinking
    )
    return _content_and_calls(reasoning, rest)


def _content_and_calls(reasoning: str | None, rest: str) -> ParsedOutput:
    start = rest.find(CALLS_BEGIN)
    if start >= 0:
        end = rest.find(CALLS_END, start)
        tail_ok = end >= 0 and not rest[end + len(CALLS_END) :].strip()
        calls = _calls(rest[start + len(CALLS_BEGIN) : end]) if tail_ok else None
        if calls:
            return ParsedOutput(rest[:start] or None, reasoning, calls)
    return ParsedOutput(content=rest, reasoning_content=reasoning)
