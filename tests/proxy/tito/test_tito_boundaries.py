"""Append-only checks: each violation opens a segment with its reason; bad input is an error."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dressage.proxy.tito import (
    BoundaryReason,
    SegmentBoundary,
    TITOInputError,
    TITOState,
    TITOTokenizer,
    TITOTurn,
)
from dressage.testing.tito_corpus import WEATHER_TOOL

pytestmark = pytest.mark.unit

IM_END = 248046
SAMPLED = (
    "Look it up.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
    "</tool_call>"
)


def _session(tito: TITOTokenizer) -> tuple[TITOState, list[dict[str, Any]]]:
    """system, user, sampled assistant (with a tool call), tool result, sampled assistant."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    state = tito.start(messages, tools=[WEATHER_TOOL]).state
    for text, follow in [
        (SAMPLED, {"role": "tool", "content": "sunny"}),
        ("ok\n</think>\n\nFine.", None),
    ]:
        out = tito.encode(text) + [IM_END]
        message = tito.parse_output(state, out).to_message()
        state = tito.record_output(state, out, assistant_message=message)
        messages = [*messages, message] + ([follow] if follow else [])
        if follow:
            step = tito.extend(state, messages, tools=[WEATHER_TOOL])
            assert isinstance(step, TITOTurn)
    return state, messages


def _extend(
    tito: TITOTokenizer, state: TITOState, messages: list[dict[str, Any]], **kw: Any
) -> Any:
    kw.setdefault("tools", [WEATHER_TOOL])
    before = (list(state.ids), list(state.echoes))
    step = tito.extend(state, [*messages, {"role": "user", "content": "next"}], **kw)
    if isinstance(step, SegmentBoundary):
        assert (state.ids, state.echoes) == before, "a boundary must leave the state untouched"
    return step


def _echo_variants(sampled: dict[str, Any]) -> list[dict[str, Any]]:
    args = json.loads(sampled["tool_calls"][0]["function"]["arguments"])
    reserialised = copy.deepcopy(sampled)
    reserialised["tool_calls"][0]["function"]["arguments"] = json.dumps(
        dict(reversed(list(args.items()))), indent=2
    )
    reserialised["tool_calls"][0]["id"] = "call_from_agent"
    no_reasoning = {k: v for k, v in sampled.items() if k != "reasoning_content"}
    parts = {**no_reasoning, "content": [{"type": "text", "text": " Checking. "}]}
    return [reserialised, no_reasoning, parts, {**no_reasoning, "refusal": None}]


def test_harmless_echo_differences_extend_the_segment(qwen35: TITOTokenizer) -> None:
    for variant in _echo_variants(_session(qwen35)[1][2]):
        state, messages = _session(qwen35)
        messages[2] = variant
        step = _extend(qwen35, state, messages)
        assert isinstance(step, TITOTurn), (variant, step)
        assert step.state.echoes[2] is variant and step.state.messages[2] is not variant
    state, messages = _session(qwen35)
    messages[4] = {"role": "assistant", "content": "Fine."}
    assert isinstance(_extend(qwen35, state, messages), TITOTurn)


@pytest.mark.parametrize(
    ("edit", "reason", "index"),
    [
        (lambda m: m[1].update(content="Weather in Rome?"), "message_rewritten", 1),
        (lambda m: m[0].update(content="Be verbose."), "system_changed", 0),
        (lambda m: m.pop(0), "system_changed", 0),
        (lambda m: m.insert(0, {"role": "system", "content": "new"}), "system_changed", 0),
        (lambda m: m.__delitem__(slice(1, 4)), "messages_removed", None),
        (lambda m: m.insert(3, m.pop(1)), "messages_removed", 1),
        (lambda m: m[4].update(content="Not fine."), "assistant_mismatch", 4),
        (lambda m: m[2].update(reasoning_content="Other."), "assistant_mismatch", 2),
        (
            lambda m: m[2]["tool_calls"][0]["function"].update(arguments='{"city": "Rome"}'),
            "assistant_mismatch",
            2,
        ),
        (lambda m: m[2]["tool_calls"].append(m[2]["tool_calls"][0]), "assistant_mismatch", 2),
        (lambda m: m[3].update(content="rainy"), "message_rewritten", 3),
    ],
)
def test_history_rewrites_open_a_segment_with_a_reason(
    qwen35: TITOTokenizer, edit: Any, reason: str, index: int | None
) -> None:
    state, messages = _session(qwen35)
    messages = copy.deepcopy(messages)
    edit(messages)
    step = _extend(qwen35, state, messages)
    assert isinstance(step, SegmentBoundary)
    assert (step.reason, step.message_index) == (BoundaryReason(reason), index), step.detail
    assert step.detail


def test_tools_and_template_kwargs_changes(qwen35: TITOTokenizer) -> None:
    state, messages = _session(qwen35)
    other = copy.deepcopy(WEATHER_TOOL)
    other["function"]["description"] = "changed"
    step = _extend(qwen35, state, messages, tools=[other])
    assert isinstance(step, SegmentBoundary) and step.reason == "tools_changed"
    assert "get_weather" in step.detail
    step = _extend(qwen35, state, messages, tools=None)
    assert isinstance(step, SegmentBoundary) and step.reason == "tools_changed"
    step = _extend(qwen35, state, messages, chat_template_kwargs={"custom": 1})
    assert isinstance(step, SegmentBoundary) and step.reason == "template_kwargs_changed"


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "developer", "content": "x"}, "message 5: unknown role 'developer'"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
            r"message 5 \(user\): content part 0 has type 'image_url'",
        ),
        (
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
            None,
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}],
            },
            r"message 5 \(assistant\): tool_calls\[0\] \(f\): arguments are not JSON",
        ),
        ({"role": "assistant", "tool_calls": [{"type": "function"}]}, "needs function.name"),
    ],
)
def test_bad_appended_messages_are_clear_errors(
    qwen35: TITOTokenizer, message: dict[str, Any], match: str | None
) -> None:
    state, messages = _session(qwen35)
    request = [*messages, message]
    if match is None:  # well-formed: a foreign assistant turn renders as prompt (mask 0)
        step = qwen35.extend(state, request, tools=[WEATHER_TOOL])
        assert isinstance(step, TITOTurn) and not any(step.state.loss_mask[-len(step.delta_ids) :])
        return
    with pytest.raises(TITOInputError, match=match):
        qwen35.extend(state, request, tools=[WEATHER_TOOL])
    with pytest.raises(TITOInputError, match=match):
        qwen35.start(request, tools=[WEATHER_TOOL])


def test_tool_message_without_a_preceding_call(qwen35: TITOTokenizer) -> None:
    state, messages = _session(qwen35)  # ends with a sampled answer that has no tool call
    orphan = [*messages, {"role": "tool", "content": "late"}]
    with pytest.raises(TITOInputError, match=r"message 5 \(tool\): a tool result must follow"):
        qwen35.extend(state, orphan, tools=[WEATHER_TOOL])
    with pytest.raises(TITOInputError, match="message 0 \\(tool\\)"):
        qwen35.start([{"role": "tool", "content": "x"}])


def test_malformed_history_fails_start_naming_the_message(qwen35: TITOTokenizer) -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
    ]
    with pytest.raises(TITOInputError, match=r"message 1 \(assistant\).*JSON object"):
        qwen35.start(history)
