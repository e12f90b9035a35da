"""Llama 3 parser: tool calls as JSON objects ``{"name": ..., "parameters": {...}}``, one a line.

The inverse of ``llama3_fixed.jinja``: optional text, a blank line, then one JSON call per line
(``<|python_tag|>`` before them is accepted). Llama 3 has no reasoning block.
"""

from __future__ import annotations

import json
from typing import Any

from dressage.proxy.parsers.base import ParsedOutput, ParsedToolCall, strip_terminators

__all__ = ["parse_llama3"]

_TERMINATORS = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
_PYTHON_TAG = "<|python_tag|>"


def _call(line: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict) or set(obj) - {"name", "parameters", "arguments"}:
        return None
    return ParsedToolCall(name=obj["name"], arguments=arguments)


def _calls(lines: list[str]) -> list[ParsedToolCall] | None:
    calls = []
    for line in lines:
        if not line.strip():
            continue
        call = _call(line.removeprefix(_PYTHON_TAG))
        if call is None:
            return None
        calls.append(call)
    return calls or None


def parse_llama3(
    text: str, *, tools: list[dict[str, Any]] | None = None, thinking: bool | None = None
) -> ParsedOutput:
    """Parse Llama 3 output; ``tools`` and ``thinking`` are accepted for a uniform signature."""
    text = strip_terminators(text, _TERMINATORS)
    lines = text.split("\n")
    for start, line in enumerate(lines):
        if not line.removeprefix(_PYTHON_TAG).lstrip().startswith("{"):
            continue
        calls = _calls(lines[start:])
        if calls is not None:
            head = "\n".join(lines[:start])
            head = head[:-1] if head.endswith("\n") else head
            return ParsedOutput(content=head or None, tool_calls=calls)
    return ParsedOutput(content=text)
