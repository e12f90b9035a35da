"""Qwen parsers: Qwen3.5 XML tool calls and Qwen3 JSON tool calls, ``<think>`` reasoning.

Qwen3.5 writes ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n
</function>\\n</tool_call>``; Qwen3 writes
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
Both are the inverse of the pinned templates in ``dressage/proxy/tito/templates``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from dressage.proxy.parsers.base import (
    ParsedOutput,
    ParsedToolCall,
    split_reasoning,
    strip_terminators,
)
from dressage.proxy.parsers.values import convert_parameter, parameter_schemas

__all__ = ["parse_qwen3", "parse_qwen35"]

_TERMINATORS = ("<|im_end|>", "<|endoftext|>")
_CALL_OPEN = "<tool_call>"
_BLOCK = re.compile(r"\s*<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_SEPARATOR = ("\n", " ", "\t", "\r")

CallReader = Callable[[str, list[dict[str, Any]] | None], ParsedToolCall | None]


def _xml_call(body: str, tools: list[dict[str, Any]] | None) -> ParsedToolCall | None:
    match = _FUNCTION.fullmatch(body)
    if match is None:
        return None
    name, inner = match.group(1).strip(), match.group(2)
    schemas = parameter_schemas(tools, name) or {}
    arguments: dict[str, Any] = {}
    pos = 0
    for param in _PARAMETER.finditer(inner):
        if param.start() != pos:
            return None
        # One whitespace character separates the value from each tag: the template writes a
        # newline, and a tool-call constraint (xgrammar's qwen_3_5 tag) lets any one stand there
        value = param.group(2)
        value = value[1:] if value[:1] in _SEPARATOR else value
        value = value[:-1] if value[-1:] in _SEPARATOR else value
        key = param.group(1).strip()
        arguments[key] = convert_parameter(value, schemas.get(key))
        pos = param.end()
    if inner[pos:].strip():
        return None
    return ParsedToolCall(name=name, arguments=arguments)


def _json_call(body: str, tools: list[dict[str, Any]] | None) -> ParsedToolCall | None:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(name=obj["name"], arguments=arguments)


def _split_calls(
    text: str, tools: list[dict[str, Any]] | None, read: CallReader, separator: str
) -> tuple[str | None, list[ParsedToolCall]]:
    start = text.find(_CALL_OPEN)
    if start < 0:
        return text, []
    calls: list[ParsedToolCall] = []
    pos = start
    while pos < len(text) and text[pos:].strip():
        block = _BLOCK.match(text, pos)
        call = read(block.group(1), tools) if block else None
        if block is None or call is None:
            # Anything we cannot read as a call leaves the whole text as content.
            return text, []
        calls.append(call)
        pos = block.end()
    head = text[:start]
    head = head.removesuffix(separator)
    return (head or None), calls


def _parse(
    text: str,
    tools: list[dict[str, Any]] | None,
    thinking: bool | None,
    read: CallReader,
    separator: str,
) -> ParsedOutput:
    text = strip_terminators(text, _TERMINATORS)
    reasoning, rest = split_reasoning(
        text, open_tag="<think>", close_tag="</think>", thinking=thinking, pad="\n", after="\n\n"
    )
    content, calls = _split_calls(rest, tools, read, separator)
    if not calls and content is None:
        content = ""
    return ParsedOutput(content=content, reasoning_content=reasoning, tool_calls=calls)


def parse_qwen35(
    text: str, *, tools: list[dict[str, Any]] | None = None, thinking: bool | None = None
) -> ParsedOutput:
    """Parse Qwen3.5 output. ``thinking=True``: the prompt ended in ``<think>\\n``;
    ``thinking=False``: it ended in the empty block ``<think>\\n\\n</think>\\n\\n``, which the
    returned message carries as ``reasoning_content=""`` so that it renders back the same."""
    parsed = _parse(text, tools, thinking, _xml_call, "\n\n")
    if thinking is False and parsed.reasoning_content is None:
        return ParsedOutput(parsed.content, "", parsed.tool_calls)
    return parsed


def parse_qwen3(
    text: str, *, tools: list[dict[str, Any]] | None = None, thinking: bool | None = None
) -> ParsedOutput:
    """Parse Qwen3 output (JSON tool calls; the model opens ``<think>`` itself)."""
    parsed = _parse(text, tools, thinking, _json_call, "\n")
    if thinking is False and parsed.reasoning_content is None:
        return ParsedOutput(parsed.content, "", parsed.tool_calls)
    return parsed
