"""The same TITO API over Llama 3, DeepSeek and Qwen3 formats, the generic and snapshot modes."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.assets import load_tokenizer
from dressage.assets.family_tokenizers import load_family_tokenizer
from dressage.proxy import tito as tito_package
from dressage.proxy.tito import (
    MODEL_TYPE_SPELLINGS,
    DeepSeekTITOTokenizer,
    Llama3TITOTokenizer,
    Qwen3TITOTokenizer,
    Qwen35TITOTokenizer,
    SegmentBoundary,
    TITOTokenizer,
    TITOTurn,
    canonical_model_type,
    create_tito_tokenizer,
    load_pinned_template,
)
from dressage.proxy.tito.replay import drift_turns, replay_tito
from dressage.testing.tito_corpus import WEATHER_TOOL, qwen35_drift_corpus

pytestmark = pytest.mark.unit

# What each family's model writes for: reasoning "Look.", a get_weather(city=Oslo) call; then
# reasoning "Done." and the answer "Snow.". None: the family has no reasoning block.
SAMPLES: dict[str, tuple[str, str]] = {
    "llama3": ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "Snow."),
    "deepseek": (
        "Look.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Oslo"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Done.</think>Snow.",
    ),
    "qwen3": (
        '<think>\nLook.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Oslo"}}\n</tool_call>',
        "<think>\nDone.\n</think>\n\nSnow.",
    ),
}
KWARGS: dict[str, dict[str, Any]] = {"deepseek": {"enable_thinking": True}}


def _tokenizer(family: str) -> Any:
    if family in ("qwen3", "qwen3.5"):
        return load_tokenizer(family)
    return load_family_tokenizer(family)


@pytest.mark.parametrize(
    ("spelling", "cls"),
    [
        ("qwen3.5", Qwen35TITOTokenizer),
        ("qwen3_5", Qwen35TITOTokenizer),
        ("qwen3", Qwen3TITOTokenizer),
        ("llama3", Llama3TITOTokenizer),
        ("deepseek", DeepSeekTITOTokenizer),
    ],
)
def test_every_spelling_builds_its_family_class_exported_by_the_package(
    spelling: str, cls: type[TITOTokenizer]
) -> None:
    family = canonical_model_type(spelling)
    tito = create_tito_tokenizer(_tokenizer(family), model_type=spelling)
    assert type(tito) is cls and cls.__name__ in tito_package.__all__
    assert tito.parser_family == family  # the canonical name, whatever the spelling


def test_spellings_and_the_error_for_an_unknown_family() -> None:
    assert MODEL_TYPE_SPELLINGS == ("qwen3.5", "qwen3_5", "qwen3", "llama3", "deepseek", "generic")
    assert [canonical_model_type(s) for s in ("qwen3_5", "qwen3.5", "generic")] == [
        "qwen3.5",
        "qwen3.5",
        "generic",
    ]
    with pytest.raises(ValueError, match=r"'qwen4'; expected one of \['qwen3.5', 'qwen3_5'"):
        create_tito_tokenizer(load_tokenizer("qwen3.5"), model_type="qwen4")


def _run(tito: TITOTokenizer, family: str, *, stop: bool = True) -> tuple[TITOTurn, list[Any]]:
    kwargs = KWARGS.get(family, {})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    turn = tito.start(messages, tools=[WEATHER_TOOL], chat_template_kwargs=kwargs)
    outputs: list[Any] = [len(turn.delta_ids)]
    follow = [{"role": "tool", "content": "snow"}, {"role": "user", "content": "Thanks"}]
    for i, (text, extra) in enumerate(zip(SAMPLES[family], follow, strict=True)):
        closer = [min(tito.closer_ids)] if stop or i else []
        out = tito.encode(text) + closer
        outputs.append(out)
        message = tito.parse_output(turn.state, out).to_message()
        state = tito.record_output(turn.state, out, assistant_message=message)
        messages = [*messages, message, extra]
        step = tito.extend(state, messages, tools=[WEATHER_TOOL], chat_template_kwargs=kwargs)
        assert isinstance(step, TITOTurn), step
        turn = step
    return turn, [messages, outputs]


@pytest.mark.parametrize("family", ["llama3", "deepseek", "qwen3"])
def test_family_round_trip_matches_whole_render(family: str) -> None:
    tito = create_tito_tokenizer(_tokenizer(family), family)
    turn, (messages, outputs) = _run(tito, family)
    outputs = outputs[1:]
    first = tito.parse_output(turn.state, outputs[0])
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("get_weather", {"city": "Oslo"})]
    whole = tito.render_conversation(
        messages, tools=[WEATHER_TOOL], chat_template_kwargs=KWARGS.get(family)
    )
    assert turn.state.ids == tito.encode(whole)
    assert sum(turn.state.loss_mask) == sum(len(o) for o in outputs)


@pytest.mark.parametrize("family", ["llama3", "deepseek", "qwen3"])
def test_family_adds_missing_closer_as_prompt(family: str) -> None:
    tito = create_tito_tokenizer(_tokenizer(family), family)
    turn, (_, (prompt_length, first, _)) = _run(tito, family, stop=False)
    closer = min(tito.closer_ids)
    held, mask = turn.state.ids, turn.state.loss_mask
    end = prompt_length + len(first)
    assert first[-1] not in tito.closer_ids and held[prompt_length:end] == first
    # The first output lacked its closer: it follows the output, with mask 0.
    assert held[end] == closer and mask[end] == 0 and mask[end - 1] == 1


def test_llama3_and_deepseek_turn_formats() -> None:
    llama = create_tito_tokenizer(load_family_tokenizer("llama3"), "llama3")
    assert llama.render_conversation([{"role": "user", "content": "Hi"}]) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    vocab = load_family_tokenizer("llama3").get_vocab()
    assert llama.stop_token_ids == [
        vocab[t] for t in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    ]
    deepseek = create_tito_tokenizer(load_family_tokenizer("deepseek"), "deepseek")
    text = deepseek.render_conversation(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    )
    assert text == "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜></think>"


def test_deepseek_mid_conversation_system_is_a_render_failure() -> None:
    tito = create_tito_tokenizer(load_family_tokenizer("deepseek"), "deepseek")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    state = tito.start(messages).state
    out = tito.encode("Hello") + [min(tito.closer_ids)]
    message = tito.parse_output(state, out).to_message()
    state = tito.record_output(state, out, assistant_message=message)
    step = tito.extend(state, [*messages, message, {"role": "system", "content": "new rule"}])
    assert isinstance(step, SegmentBoundary) and step.reason == "render_failed"
    assert "system message can only open" in step.detail and step.message_index == 2


def test_generic_mode_encodes_only_the_suffix_or_announces_a_boundary(
    qwen35_tokenizer: Any,
) -> None:
    """Over the drift corpus, generic mode either stitches exactly TITO's ids, or, where the
    template renders a parsed message differently from the sampled text (a normalised number,
    compact JSON, stripped whitespace), opens a segment: never a silent change of sent ids."""
    generic = create_tito_tokenizer(
        qwen35_tokenizer, "generic", chat_template=load_pinned_template("qwen3.5"), parser="qwen3.5"
    )
    pinned = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    extended = 0
    for conv in qwen35_drift_corpus():
        ours, theirs = replay_tito(pinned, conv), replay_tito(generic, conv)
        assert drift_turns(theirs.calls) <= len(theirs.boundaries), conv.name
        assert {b.reason for b in theirs.boundaries} <= {"template_prefix_mismatch"}
        if not theirs.boundaries:
            extended += 1
            assert theirs.state is not None and ours.state is not None
            assert theirs.state.ids == ours.state.ids, conv.name
    assert extended >= 6


def test_generic_mode_opens_a_segment_when_the_template_rewrites_history(
    qwen35_tokenizer: Any,
) -> None:
    # A stock-like template: reasoning only for assistant turns after the last user message.
    dropping = load_pinned_template("qwen3.5").replace(
        "message.reasoning_content is defined and message.reasoning_content is not none",
        "message.reasoning_content is defined and message.reasoning_content is not none"
        " and loop.index0 > ns.last_user",
    )
    dropping = (
        "{%- set ns = namespace(last_user=-1) -%}{%- for m in messages -%}"
        "{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
        "{%- endfor -%}" + dropping
    )
    generic = create_tito_tokenizer(
        qwen35_tokenizer, "generic", chat_template=dropping, parser="qwen3.5"
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
    state = generic.start(messages).state
    out = generic.encode("Add.\n</think>\n\n4") + [248046]
    message = generic.parse_output(state, out).to_message()
    state = generic.record_output(state, out, assistant_message=message)
    step = generic.extend(state, [*messages, message, {"role": "user", "content": "3+3?"}])
    assert isinstance(step, SegmentBoundary) and step.reason == "template_prefix_mismatch"
    assert "<think>" in step.detail


def test_snapshot_mode_extends_when_stable_and_flags_drift(qwen35_tokenizer: Any) -> None:
    snapshot = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5", build_mode="snapshot")
    tito = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    stable = next(c for c in qwen35_drift_corpus() if c.name == "reasoning of earlier turns")
    a, b = replay_tito(snapshot, stable), replay_tito(tito, stable)
    assert a.boundaries == [] and a.state is not None and b.state is not None
    assert a.state.ids == b.state.ids
    reasons = {
        boundary.reason
        for conv in qwen35_drift_corpus()
        for boundary in replay_tito(snapshot, conv).boundaries
    }
    assert reasons == {"retokenization_drift"}


@pytest.mark.parametrize("family", ["llama3", "deepseek", "qwen3"])
def test_pinned_templates_render_the_same_through_transformers(family: str) -> None:
    tokenizer = _tokenizer(family)
    tito = create_tito_tokenizer(tokenizer, family)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {
            "role": "assistant",
            "content": "A",
            "reasoning_content": "R",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "X"}}}],
        },
        {"role": "tool", "content": "T"},
    ]
    hf = tokenizer.apply_chat_template(
        messages,
        tools=[WEATHER_TOOL],
        chat_template=load_pinned_template(family),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert hf == tito.render_conversation(messages, tools=[WEATHER_TOOL])


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_generic_mode_over_a_tokenizers_own_template(family: str) -> None:
    tokenizer = _tokenizer(family)  # carries the pinned template as its chat_template
    generic = create_tito_tokenizer(tokenizer, "generic", parser=family)
    turn, _ = _run(generic, family)
    ours, _ = _run(create_tito_tokenizer(tokenizer, family), family)
    assert turn.state.ids == ours.state.ids
    assert turn.state.loss_mask == ours.state.loss_mask
