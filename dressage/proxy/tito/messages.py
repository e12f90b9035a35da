"""OpenAI chat messages as TITO reads them: validation, template form, and echo comparison.

Validation fails with :class:`TITOInputError` naming the message index, role and value. The
template form is what the pinned templates render: content as one string, tool-call arguments as a
mapping. :func:`assistant_difference` decides whether an assistant message an agent echoed back is
the one the proxy returned, tolerating what agents harmlessly change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dressage.http_json import JSONBodyError, parse_json_body
from dressage.proxy.tito.state import TITOInputError

__all__ = ["ROLES", "assistant_difference", "content_text", "template_form", "validate_messages"]

ROLES = frozenset({"system", "user", "assistant", "tool"})


def _where(index: int, message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    return f"message {index} ({role})"


def content_text(message: dict[str, Any], index: int, key: str = "content") -> str:
    """The text of ``message[key]``: a string, None, or a list of ``{"type": "text"}`` parts."""
    content = message.get(key)
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TITOInputError(
            f"{_where(index, message)}: {key} must be a string, null or a list of parts, "
            f"got {type(content).__name__}"
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise TITOInputError(
                f"{_where(index, message)}: {key} part {j} has type {kind!r}; only text parts "
                f"can be rendered by a text chat format"
            )
        texts.append(part["text"])
    return "".join(texts)


def _arguments(call: Any, index: int, j: int, message: dict[str, Any]) -> tuple[str, Any]:
    where = f"{_where(index, message)}: tool_calls[{j}]"
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise TITOInputError(f"{where} is malformed: needs function.name, got {call!r:.200}")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:  # parsed as a request body is: bounded depth, no lone surrogates
            raw = arguments.encode("utf-8", "surrogatepass")
            arguments = parse_json_body(raw, what="the arguments") if arguments.strip() else {}
        except JSONBodyError as exc:
            raise TITOInputError(
                f"{where} ({function['name']}): arguments are not JSON ({exc}): {arguments!r:.200}"
            ) from None
    if not isinstance(arguments, dict):
        raise TITOInputError(
            f"{where} ({function['name']}): arguments must be a JSON object, got {arguments!r:.200}"
        )
    return function["name"], arguments


def tool_calls_of(message: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any]]]:
    """``(name, arguments)`` of each tool call, arguments parsed from their JSON string."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise TITOInputError(f"{_where(index, message)}: tool_calls must be a list")
    return [_arguments(call, index, j, message) for j, call in enumerate(calls)]


def validate_messages(messages: Sequence[Any], start: int = 0) -> None:
    """Check ``messages[start:]``; ``messages[start - 1]`` is context for a leading tool message."""
    for i in range(start, len(messages)):
        message = messages[i]
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            raise TITOInputError(
                f"message {i}: unknown role {role!r}; expected one of {sorted(ROLES)}"
            )
        content_text(message, i)
        if message["role"] == "assistant":
            tool_calls_of(message, i)
            reasoning = message.get("reasoning_content")
            if reasoning is not None and not isinstance(reasoning, str):
                raise TITOInputError(f"{_where(i, message)}: reasoning_content must be a string")
        elif message["role"] == "tool":
            _check_tool_follows_call(messages, i)


def _check_tool_follows_call(messages: Sequence[Any], i: int) -> None:
    j = i - 1
    while j >= 0 and messages[j].get("role") == "tool":
        j -= 1
    if j < 0 or messages[j].get("role") != "assistant" or not messages[j].get("tool_calls"):
        raise TITOInputError(
            f"message {i} (tool): a tool result must follow an assistant message with tool_calls"
            f" (found {messages[j].get('role') if j >= 0 else 'nothing'!r} before it)"
        )


def template_form(messages: Sequence[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    """``messages[start:]`` as the pinned templates take them (validated first)."""
    out = []
    for i in range(start, len(messages)):
        message = messages[i]
        form: dict[str, Any] = {"role": message["role"], "content": content_text(message, i)}
        if message["role"] == "assistant":
            form["reasoning_content"] = message.get("reasoning_content")
            form["tool_calls"] = [
                {"name": name, "arguments": args} for name, args in tool_calls_of(message, i)
            ]
        out.append(form)
    return out


def _same_text(a: str, b: str) -> bool:
    # Agents often strip what they display; surrounding whitespace is not a rewrite.
    return a == b or a.strip() == b.strip()


def assistant_difference(echoed: Any, sampled: dict[str, Any], index: int) -> str | None:
    """None when ``echoed`` is the assistant message the proxy returned, else what differs.

    Tolerated: a missing or null ``reasoning_content``, content None vs "" (or as text parts),
    surrounding whitespace, tool-call ids, and arguments JSON re-serialised (whitespace, key order).
    """
    if not isinstance(echoed, dict) or echoed.get("role") != "assistant":
        return f"message {index}: expected the sampled assistant message, got {echoed!r:.120}"
    try:
        echoed_text = content_text(echoed, index)
        echoed_calls = tool_calls_of(echoed, index)
    except TITOInputError as exc:
        return str(exc)
    if not _same_text(echoed_text, content_text(sampled, index)):
        return f"message {index} (assistant): content differs from the sampled output"
    reasoning = echoed.get("reasoning_content")
    if reasoning is not None and not _same_text(reasoning, sampled.get("reasoning_content") or ""):
        return f"message {index} (assistant): reasoning_content differs from the sampled output"
    sampled_calls = tool_calls_of(sampled, index)
    if len(echoed_calls) != len(sampled_calls):
        return (
            f"message {index} (assistant): {len(echoed_calls)} tool calls, "
            f"{len(sampled_calls)} were sampled"
        )
    for j, (got, want) in enumerate(zip(echoed_calls, sampled_calls, strict=True)):
        if got != want:
            return f"message {index} (assistant): tool_calls[{j}] {got[0]!r} differs from {want}"
    return None
