"""Qwen3.5 / Qwen3 output parsing: tool calls, reasoning, typed parameters, never raising."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.proxy.parsers import ParsedOutput, parse_assistant_output, register_parser

pytestmark = pytest.mark.unit

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "nights": {"type": "integer"},
                    "budget": {"type": "number"},
                    "late": {"type": "boolean"},
                    "guests": {"type": "array"},
                    "prefs": {"type": "object"},
                    "code": {"type": "string"},
                    "maybe": {"type": ["null", "integer"]},
                },
            },
        },
    }
]


def _call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def _args(parsed: ParsedOutput, i: int = 0) -> dict[str, Any]:
    return json.loads(parsed.to_message()["tool_calls"][i]["function"]["arguments"])


def test_reasoning_content_and_typed_tool_calls() -> None:
    text = (
        "<think>\nPlan the trip.\n</think>\n\nBooking now.\n\n"
        + _call(
            "book",
            city="Paris",
            nights="3",
            budget="2.50",
            late="true",
            guests='["ann", "bo"]',
            prefs='{"view": "sea"}',
            code="007",
            maybe="null",
        )
        + "\n"
        + _call("book", city="Multi\nline")
        + "<|im_end|>"
    )
    parsed = parse_assistant_output(text, family="qwen3.5", tools=TOOLS)
    assert parsed.reasoning_content == "Plan the trip."
    assert parsed.content == "Booking now."
    assert parsed.finish_reason_hint == "tool_calls"
    assert _args(parsed) == {
        "city": "Paris",
        "nights": 3,
        "budget": 2.5,
        "late": True,
        "guests": ["ann", "bo"],
        "prefs": {"view": "sea"},
        "code": "007",
        "maybe": None,
    }
    assert _args(parsed, 1) == {"city": "Multi\nline"}
    message = parsed.to_message()
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in message["tool_calls"])
    assert message["tool_calls"][0]["id"] != message["tool_calls"][1]["id"]


def test_without_schema_values_become_json_only_when_they_are_structured() -> None:
    text = _call("anything", a="3", b='{"x": 1}', c="[1]", d="true", e="hello", f="null", g='"q"')
    assert _args(parse_assistant_output(text, family="qwen3.5")) == {
        "a": 3,
        "b": {"x": 1},
        "c": [1],
        "d": True,
        "e": "hello",
        "f": "null",
        "g": '"q"',
    }


def test_one_whitespace_character_separates_a_value_from_its_tags() -> None:
    """The template writes a newline there; a tool-call constraint (xgrammar's qwen_3_5 tag)
    lets any one whitespace character stand in its place, or none. More is the value's own."""
    body = (
        "<parameter=city>Paris\t</parameter>\n<parameter=code> AB</parameter>\n"
        "<parameter=nights>\t3 </parameter>\n<parameter=late>\n  spaced \n\n</parameter>\n"
    )
    text = f"<tool_call>\n<function=book>\n{body}</function>\n</tool_call>"
    assert _args(parse_assistant_output(text, family="qwen3.5", tools=TOOLS)) == {
        "city": "Paris",
        "code": "AB",
        "nights": 3,
        "late": "  spaced \n",  # not a boolean: kept as written, less one separator each side
    }


def test_schema_type_mismatch_keeps_the_string() -> None:
    text = _call("book", nights="three", guests="not json", late="yes")
    assert _args(parse_assistant_output(text, family="qwen3.5", tools=TOOLS)) == {
        "nights": "three",
        "guests": "not json",
        "late": "yes",
    }


@pytest.mark.parametrize(
    ("thinking", "text", "reasoning", "content"),
    [
        (True, "step\n</think>\n\nanswer", "step", "answer"),
        (True, "cut off in the middle", "cut off in the middle", ""),
        (False, "answer", "", "answer"),
        (None, "answer", None, "answer"),
        (None, "<think>\nr\n</think>\n\na", "r", "a"),
        (None, "r\n</think>\n\na", "r", "a"),
    ],
)
def test_reasoning_split(
    thinking: bool | None, text: str, reasoning: str | None, content: str
) -> None:
    parsed = parse_assistant_output(text, family="qwen3.5", thinking=thinking)
    assert (parsed.reasoning_content, parsed.content) == (reasoning, content)
    assert parsed.tool_calls == [] and parsed.finish_reason_hint is None


@pytest.mark.parametrize(
    "text",
    [
        "Sure. <tool_call>\n<function=book>\n<parameter=city>\nParis",
        "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=book>\nstray text\n</function>\n</tool_call>",
        _call("book", city="x") + " trailing words",
        "<tool_call></tool_call>",
    ],
)
def test_unparseable_tool_calls_come_back_as_content(text: str) -> None:
    parsed = parse_assistant_output(text, family="qwen3.5", tools=TOOLS)
    assert parsed.tool_calls == [] and parsed.content == text


def test_qwen3_json_tool_calls() -> None:
    text = (
        '<think>\nok\n</think>\n\nHere.\n<tool_call>\n{"name": "book", '
        '"arguments": {"city": "Rome"}}\n</tool_call>\n<tool_call>\n{"name": "book", '
        '"arguments": "{\\"nights\\": 2}"}\n</tool_call>'
    )
    parsed = parse_assistant_output(text, family="qwen3")
    assert (parsed.reasoning_content, parsed.content) == ("ok", "Here.")
    assert [_args(parsed, 0), _args(parsed, 1)] == [{"city": "Rome"}, {"nights": 2}]
    bad = '<tool_call>\n{"name": "book", "arguments": [1]}\n</tool_call>'
    assert parse_assistant_output(bad, family="qwen3").content == bad


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/=\n abtoolcalfunctionparemhink_{}"[]:1'))))
def test_parser_never_raises(text: str) -> None:
    for family in ("qwen3.5", "qwen3", "llama3", "deepseek"):
        parsed = parse_assistant_output(text, family=family, tools=TOOLS)
        assert parsed.content is not None or parsed.tool_calls


def test_registry() -> None:
    with pytest.raises(ValueError, match="no output parser for family 'gpt'"):
        parse_assistant_output("x", family="gpt")
    with pytest.raises(ValueError, match="already registered"):
        register_parser("qwen3.5", lambda text, **kw: ParsedOutput(content=text))
