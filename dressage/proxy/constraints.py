"""``tool_choice``, ``response_format``, ``parallel_tool_calls`` and ``tools[].function.strict``
turned into the engine's own constraint: one of SGLang's ``json_schema`` / ``structural_tag``
sampling parameters, as SGLang's OpenAI server does (xgrammar's structural tags).

    constraint = engine_constraint(request, family="qwen3.5", thinking=True)
    sampling[constraint.key] = constraint.value        # None: nothing to constrain

What each asks of the model's output (the Qwen formats; the tool-call syntax and the reasoning
block are the family's, built with xgrammar's model structural tags):

    tool_choice "auto" (default)   nothing, unless a tool is strict or parallel_tool_calls is
                                   false: then every call's arguments follow its tool's schema
                                   (a non-strict tool: any object) and, with parallel false, at
                                   most one call is made
    tool_choice "none"             text only: ``<tool_call>`` cannot be written
    tool_choice "required"         at least one call (one, with parallel_tool_calls false)
    {"type": "function", ...}      exactly one call of that function
    {"type": "allowed_tools", "allowed_tools": {"mode": "auto"|"required", "tools": [...]}}
                                   as auto / required over the listed tools only
    response_format json_schema    the answer (after the reasoning block) is JSON of the schema;
      (strict or not), json_object a JSON object; with tools under "auto", a call or the JSON

The reasoning block, when the prompt opens one, is free text up to ``</think>``. Everything is
checked here before any generation: a schema the grammar library cannot build is a 400 naming
the failing part. Families without a known tool-call format get a 400 when a tool constraint
is asked for; their ``response_format`` goes to the engine as a plain ``json_schema``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dressage.proxy.errors import BadRequest

__all__ = ["EngineConstraint", "engine_constraint"]

_STRUCTURAL_FAMILIES = {"qwen3.5": "qwen_3_5", "qwen3": "qwen_3"}
_THINK_EXCLUDES = ["<think>", "</think>"]
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
MAX_WHITESPACE = 1
"""Most whitespace characters between JSON tokens (xgrammar's ``max_whitespace_cnt``): a
small model given free whitespace can loop on blanks until its token budget is gone."""


@dataclass(frozen=True)
class EngineConstraint:
    key: str
    """The SGLang sampling parameter: ``json_schema`` or ``structural_tag``."""
    value: str
    """Its JSON text."""


def _response_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not response_format or response_format.get("type") == "text":
        return None
    if response_format["type"] == "json_object":
        return _ANY_OBJECT
    schema: dict[str, Any] = response_format["json_schema"].get("schema") or _ANY_OBJECT
    return schema


def _tool_mode(request: Any) -> tuple[str, list[dict[str, Any]]]:
    """(``none`` | ``auto`` | ``required`` | ``forced``, the tools it ranges over)."""
    tools: list[dict[str, Any]] = request.tools or []
    choice = request.tool_choice
    if not tools or choice == "none":
        return "none", []
    if choice in (None, "auto"):
        return "auto", tools
    if choice == "required":
        return "required", tools
    if choice.get("type") == "allowed_tools":
        allowed = choice["allowed_tools"]
        names = {ref["function"]["name"] for ref in allowed["tools"]}
        subset = [t for t in tools if t["function"]["name"] in names]
        return allowed.get("mode", "auto"), subset
    name = choice["function"]["name"]
    return "forced", [t for t in tools if t["function"]["name"] == name]


def _needed(request: Any, mode: str, tools: list[dict[str, Any]]) -> bool:
    if _response_schema(request.response_format) is not None:
        return True
    if not request.tools:
        return False
    if mode == "auto":
        strict = any(t["function"].get("strict") for t in tools)
        return strict or not request.parallel_tool_calls or len(tools) < len(request.tools)
    return True


def engine_constraint(
    request: Any, *, family: str, thinking: bool | None
) -> EngineConstraint | None:
    """The constraint ``request`` (a :class:`~dressage.proxy.openai_api.ChatRequest`) asks for,
    or None; :class:`~dressage.proxy.errors.BadRequest` when it cannot be enforced."""
    mode, tools = _tool_mode(request)
    if not _needed(request, mode, tools):
        return None
    schema = _response_schema(request.response_format)
    model = _STRUCTURAL_FAMILIES.get(family)
    if model is None:
        if request.tools and (mode != "none" or request.tool_choice == "none"):
            raise BadRequest(
                f"tool_choice {request.tool_choice!r} (or parallel_tool_calls, strict tools) "
                "needs constrained decoding of tool calls, which the proxy knows for the qwen3.5 "
                f"and qwen3 formats only; this proxy runs {family!r}",
                param="tool_choice",
            )
        assert schema is not None
        return EngineConstraint("json_schema", json.dumps(schema))
    tag = _structural_tag(model, request, mode, tools, schema, bool(thinking))
    _check_builds(tag, "response_format" if schema is not None else "tools")
    return EngineConstraint("structural_tag", tag)


def _structural_tag(
    model: str,
    request: Any,
    mode: str,
    tools: list[dict[str, Any]],
    schema: dict[str, Any] | None,
    thinking: bool,
) -> str:
    import xgrammar as xgr
    from xgrammar.structural_tag import (
        AnyTextFormat,
        ConstStringFormat,
        JSONSchemaFormat,
        OrFormat,
        SequenceFormat,
        StructuralTag,
        TagFormat,
    )

    def tool_calls(choice: Any, reasoning: str) -> Any:
        # strict tools keep their schema; under "auto" the others take any object
        shaped: list[Any] = [
            {
                "type": "function",
                "function": {
                    "name": t["function"]["name"],
                    "parameters": (
                        (t["function"].get("parameters") or _ANY_OBJECT)
                        if t["function"].get("strict") or mode != "auto"
                        else _ANY_OBJECT
                    ),
                },
            }
            for t in tools
        ]
        return xgr.get_builtin_structural_tag(
            model,
            tools=shaped,
            tool_choice=choice,
            reasoning=reasoning,  # type: ignore[arg-type]
            parallel_tool_calls=bool(request.parallel_tool_calls),
            max_whitespace_cnt=MAX_WHITESPACE,
        )

    if mode == "forced":
        choice = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        return str(tool_calls(choice, "enabled" if thinking else "disabled").model_dump_json())
    if mode == "required" or (mode == "auto" and schema is None):
        return str(tool_calls(mode, "enabled" if thinking else "disabled").model_dump_json())
    if mode == "none":
        answer: Any = (
            JSONSchemaFormat(json_schema=schema, max_whitespace_cnt=MAX_WHITESPACE)
            if schema is not None
            else AnyTextFormat(excludes=[*_THINK_EXCLUDES, "<tool_call>"])
        )
    else:  # tools under "auto" and a response format: calls, or the JSON answer
        assert schema is not None
        calls = tool_calls("required", "disabled").format
        answer = OrFormat(
            elements=[
                calls,
                JSONSchemaFormat(json_schema=schema, max_whitespace_cnt=MAX_WHITESPACE),
            ]
        )
    if not thinking:
        return str(StructuralTag(format=answer).model_dump_json())
    think = TagFormat(begin="", content=AnyTextFormat(excludes=_THINK_EXCLUDES), end="</think>")
    sequence = SequenceFormat(elements=[think, ConstStringFormat(value="\n\n"), answer])
    return str(StructuralTag(format=sequence).model_dump_json())


def _check_builds(tag: str, param: str) -> None:
    """The grammar library builds the constraint (no tokenizer needed), or a 400 naming why."""
    import xgrammar as xgr

    try:
        xgr.Grammar.from_structural_tag(tag)
    except (RuntimeError, ValueError, TypeError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if text.startswith("[") and ": " in text:
            text = text.split(": ", 1)[1]
        raise BadRequest(
            f"{param}: the schema cannot be compiled by the grammar library (xgrammar): "
            f"{text[:400]}",
            param=param,
        ) from None
