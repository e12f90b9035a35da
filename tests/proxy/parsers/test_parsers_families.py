"""Parsers are the inverse of the pinned templates: render a message, parse it back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dressage.assets import load_tokenizer
from dressage.assets.family_tokenizers import load_family_tokenizer
from dressage.proxy.parsers import parse_assistant_output
from dressage.proxy.tito import create_tito_tokenizer

pytestmark = pytest.mark.unit

MESSAGES: list[dict[str, Any]] = [
    {"role": "assistant", "content": "Plain answer."},
    {"role": "assistant", "content": "Two lines\nof text.", "reasoning_content": "Think."},
    {
        "role": "assistant",
        "content": "Calling.",
        "reasoning_content": "Need data.",
        "tool_calls": [
            {"function": {"name": "search", "arguments": {"q": "tito", "k": 3}}},
            {"function": {"name": "fetch", "arguments": {"urls": ["a", "b"], "deep": True}}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "noop", "arguments": {}}}],
    },
]


def _tokenizer(family: str) -> Any:
    if family in ("qwen3.5", "qwen3"):
        return load_tokenizer(family)
    return load_family_tokenizer(family)


HEADERS = {
    "qwen3.5": "<|im_start|>assistant\n",
    "qwen3": "<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "deepseek": "<｜Assistant｜>",
}


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3", "llama3", "deepseek"])
def test_parse_inverts_the_pinned_template(family: str) -> None:
    tito = create_tito_tokenizer(_tokenizer(family), family)
    history = [{"role": "user", "content": "hi"}]
    before = tito.render_conversation(history, add_generation_prompt=False)
    for message in MESSAGES:
        if family == "llama3":
            message = {k: v for k, v in message.items() if k != "reasoning_content"}
        whole = tito.render_conversation([*history, message], add_generation_prompt=False)
        turn = whole[len(before) :]
        assert turn.startswith(HEADERS[family])
        # What the model wrote: the assistant turn after its header, closer included.
        sampled = turn[len(HEADERS[family]) :].removesuffix("\n")
        got = parse_assistant_output(sampled, family=family).to_message()
        assert (got["content"] or None) == (message["content"] or None), (family, sampled)
        assert got.get("reasoning_content") == message.get("reasoning_content"), (family, sampled)
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in got.get("tool_calls", [])
        ]
        want = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls", [])
        ]
        assert calls == want, (family, sampled)


def test_llama3_and_deepseek_bad_calls_stay_content() -> None:
    bad_llama = '{"name": "f", "parameters": {"x": 1}, "extra": 2}'
    assert parse_assistant_output(bad_llama, family="llama3").content == bad_llama
    text = "Calling.\n\n<|python_tag|>" + '{"name": "f", "arguments": {"x": 1}}<|eom_id|>'
    parsed = parse_assistant_output(text, family="llama3")
    assert parsed.content == "Calling." and parsed.tool_calls[0].arguments == {"x": 1}
    cut = 'ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": '
    assert parse_assistant_output(cut, family="deepseek").content == cut
