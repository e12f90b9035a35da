"""Property tests: for generated conversations the stitched ids are exactly what the engine
received and produced, and delta rendering agrees with whole rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dressage.assets import load_tokenizer
from dressage.proxy.tito import TITOTurn, create_tito_tokenizer
from dressage.proxy.tito.replay import (
    ScriptedConversation,
    ScriptedTurn,
    drift_turns,
    replay_tito,
    sampled_ids,
)
from dressage.testing.tito_corpus import TOOLS, sdk_echo, strip_echo

pytestmark = pytest.mark.unit

TITO = create_tito_tokenizer(load_tokenizer("qwen3.5"), "qwen3.5")
FRAGMENTS = [
    "</think>\n\n",
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=set_price>\n<parameter=price>\n2.50\n</parameter>\n",
    "<think>",
    " ",
    "\n",
    "\n\n",
    "  ",
    "你好",
    "🎉",
    "12345",
    "internationaliz",
    "ation",
    "def f(x):\n    return x",
]
text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=5).map(
    "".join
)
piece = st.one_of(text, st.binary(min_size=1, max_size=3))
settings_ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reserialise(message: dict[str, Any]) -> dict[str, Any]:
    calls = [
        {
            **c,
            "function": {
                **c["function"],
                "arguments": json.dumps(
                    json.loads(c["function"]["arguments"]), indent=1, sort_keys=True
                ),
            },
        }
        for c in message.get("tool_calls") or []
    ]
    return {**message, "tool_calls": calls} if calls else message


ECHOES = [None, sdk_echo, strip_echo, _reserialise]


@settings_
@given(data=st.data())
def test_stitched_ids_are_what_the_engine_received_and_produced(data: st.DataObject) -> None:
    thinking = data.draw(st.booleans(), label="thinking")
    turns: list[ScriptedTurn] = []
    kwargs = {"enable_thinking": thinking}
    state = TITO.start(
        [{"role": "user", "content": "go"}], tools=TOOLS, chat_template_kwargs=kwargs
    ).state
    for _ in range(data.draw(st.integers(1, 4), label="turns")):
        scripted = ScriptedTurn(
            pieces=data.draw(st.lists(piece, max_size=4), label="pieces"),
            stopped=data.draw(st.booleans(), label="stopped"),
        )
        # The agent answers tool calls with tool results, anything else with a user message.
        calls = TITO.parse_output(state, sampled_ids(TITO, scripted)).tool_calls
        follow = [{"role": "tool", "content": data.draw(text)} for _ in calls]
        if not calls or data.draw(st.booleans()):
            follow.append({"role": "user", "content": data.draw(text)})
        scripted.follow_up = follow
        turns.append(scripted)
    conv = ScriptedConversation(
        name="generated",
        category="property",
        messages=[{"role": "user", "content": "go"}],
        turns=turns,
        tools=TOOLS,
        chat_template_kwargs=kwargs,
        echo=data.draw(st.sampled_from(ECHOES), label="echo"),
    )
    replay = replay_tito(TITO, conv)
    assert replay.boundaries == []
    assert drift_turns(replay.calls) == 0
    assert replay.state is not None
    stitched, mask = replay.state.ids, replay.state.loss_mask
    last = replay.calls[-1]
    assert stitched[: len(last.input_ids) + len(last.output_ids)] == (
        last.input_ids + last.output_ids
    )
    expected_mask = [0] * len(stitched)
    for call in replay.calls:
        expected_mask[len(call.input_ids) : len(call.input_ids) + len(call.output_ids)] = [1] * len(
            call.output_ids
        )
    assert mask == expected_mask
    for before, after in zip(replay.calls, replay.calls[1:], strict=False):
        delta = after.input_ids[len(before.input_ids) + len(before.output_ids) :]
        closed = bool(before.output_ids) and before.output_ids[-1] in TITO.closer_ids
        assert (delta[0] in TITO.closer_ids) != closed
        assert TITO.decode(delta).endswith(
            "<|im_start|>assistant\n<think>\n"
            if thinking
            else "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )


words = st.text(
    alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd", "Lo")), min_size=1, max_size=8
)
sentence = st.lists(words, min_size=1, max_size=6).map(" ".join)


@settings_
@given(
    turns=st.lists(st.tuples(sentence, sentence, st.booleans(), sentence), min_size=1, max_size=4)
)
def test_delta_rendering_agrees_with_whole_rendering(
    turns: list[tuple[str, str, bool, str]],
) -> None:
    """When the model samples exactly what the template would write (canonical ids, closer
    included), TITO's stitched ids equal the pinned template's whole render, encoded."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    state = TITO.start(messages, tools=TOOLS).state
    for reasoning, content, call, follow in turns:
        args = {"cmd": content} if call else None
        text = f"{reasoning}\n</think>\n\n{content}"
        if args:
            text += f"\n\n<tool_call>\n<function=run>\n<parameter=cmd>\n{content}\n</parameter>\n"
            text += "</function>\n</tool_call>"
        out = TITO.encode(text) + [min(TITO.closer_ids)]
        message = TITO.parse_output(state, out).to_message()
        state = TITO.record_output(state, out, assistant_message=message)
        extra = {"role": "tool", "content": follow} if call else {"role": "user", "content": follow}
        messages = [*messages, message, extra]
        step = TITO.extend(state, messages, tools=TOOLS)
        assert isinstance(step, TITOTurn)
        state = step.state
    assert state.ids == TITO.encode(TITO.render_conversation(messages, tools=TOOLS))
