"""Unit tests: streamed deltas add up to exactly the message the parser reads from the whole
output, however the output is cut into chunks (the agent echoes what it accumulated)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.proxy.parsers import parse_assistant_output
from dressage.proxy.streaming import STREAM_FORMATS, IncrementalDecoder, StreamSplitter
from dressage.proxy.tito import TITOTokenizer

pytestmark = pytest.mark.unit

CALL = (
    "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
    "</function>\n</tool_call>"
)
REASONING = st.sampled_from(["", "plan it", "line one\nline two\n", "\n\nedge\n", "a < b"])
CONTENT = st.sampled_from(["", "Done.", "Let me check.", "x\n\ny", "ends with newline\n", "<tool"])
TAIL = st.sampled_from(["", CALL, f"{CALL}\n{CALL}", "<tool_call>\nnot a call</tool_call>"])
END = st.sampled_from(["<|im_end|>", "<|endoftext|>", "", "\n"])


def _stream(text: str, cuts: list[int], thinking: bool | None, family: str) -> dict[str, str]:
    splitter = StreamSplitter(STREAM_FORMATS[family], thinking=thinking)
    sent = {"reasoning_content": "", "content": ""}
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for a, b in zip(points, points[1:], strict=False):
        for key, value in splitter.push(text[a:b]).items():
            sent[key] += value
    final = parse_assistant_output(text, family=family, thinking=thinking).to_message()
    for key, value in splitter.finish(final).items():
        sent[key] += value
    assert not splitter.diverged
    assert sent["reasoning_content"] == (final.get("reasoning_content") or "")
    assert sent["content"] == (final.get("content") or "")
    return sent


@settings(max_examples=300, deadline=None)
@given(REASONING, CONTENT, TAIL, END, st.lists(st.integers(0, 10_000), max_size=12))
def test_thinking_outputs_stream_to_the_parsed_message(
    reasoning: str, content: str, tail: str, end: str, cuts: list[int]
) -> None:
    head = f"{content}\n\n{tail}" if content and tail else content + tail
    text = f"{reasoning}\n</think>\n\n{head}{end}"
    _stream(text, cuts, True, "qwen3.5")


@settings(max_examples=200, deadline=None)
@given(CONTENT, TAIL, END, st.lists(st.integers(0, 10_000), max_size=12))
def test_non_thinking_outputs_stream_to_the_parsed_message(
    content: str, tail: str, end: str, cuts: list[int]
) -> None:
    head = f"{content}\n\n{tail}" if content and tail else content + tail
    _stream(head + end, cuts, False, "qwen3.5")


@settings(max_examples=150, deadline=None)
@given(REASONING, CONTENT, END, st.lists(st.integers(0, 10_000), max_size=12))
def test_qwen3_opens_its_own_think_block(
    reasoning: str, content: str, end: str, cuts: list[int]
) -> None:
    _stream(f"<think>\n{reasoning}\n</think>\n\n{content}{end}", cuts, None, "qwen3")


def test_nothing_of_a_tool_call_is_streamed_as_text() -> None:
    text = f"x\n</think>\n\nI will read it.\n\n{CALL}<|im_end|>"
    splitter = StreamSplitter(STREAM_FORMATS["qwen3.5"], thinking=True)
    streamed = "".join(splitter.push(ch).get("content", "") for ch in text)
    assert streamed == "I will read it."
    assert "<tool" not in streamed


def test_stop_strings_are_held_back() -> None:
    splitter = StreamSplitter(STREAM_FORMATS["qwen3.5"], thinking=False, stops=["STOP"])
    streamed = "".join(splitter.push(ch).get("content", "") for ch in "answer STOP")
    assert streamed == "answer "


def test_families_without_a_format_stream_only_at_the_end() -> None:
    splitter = StreamSplitter(None, thinking=None)
    assert splitter.push("hello") == {}
    assert splitter.finish({"role": "assistant", "content": "hello"}) == {"content": "hello"}


def test_incremental_decoder_never_splits_a_character(qwen35_tito: TITOTokenizer) -> None:
    text = "naïve café 😀🎉 数据 done"
    ids = qwen35_tito.encode(text)
    decoder = IncrementalDecoder(qwen35_tito.decode)
    pieces = [decoder.push([i]) for i in ids] + [decoder.flush()]
    assert "".join(pieces) == qwen35_tito.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)


def _message(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", **fields}


def test_divergence_is_detected_not_hidden() -> None:
    splitter = StreamSplitter(STREAM_FORMATS["qwen3.5"], thinking=False)
    splitter.push("hello world")
    assert splitter.finish(_message(content="goodbye")) == {}
    assert splitter.diverged


def test_a_stream_cut_inside_a_character_sends_its_tail(
    tmp_path: Any, qwen35_tito: TITOTokenizer
) -> None:
    """An output that ends inside a multi-byte character (``max_tokens`` reached mid-emoji):
    the held-back tail must reach the agent, so that what it accumulated is the recorded
    message (it was marked sent and dropped: the agent's echo then differed)."""
    from openai import OpenAI

    from dressage.proxy.client import SyncProxyClient
    from dressage.proxy.testing import EngineReply
    from tests.proxy.conftest import Script, scripted_proxy

    ids = qwen35_tito.encode("Here: 🦄")[:-1]  # the emoji's last byte token cut off
    script = Script(qwen35_tito, EngineReply(ids, finish="length"))
    with scripted_proxy(script, tmp_path, qwen35_tito, admin_key="key-1234") as (url, _):
        client = OpenAI(base_url=f"{url}/sessions/cut/v1", api_key="x", max_retries=0)
        chunks = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        trajectory = SyncProxyClient(url, admin_key="key-1234").read_trajectory("cut")
    recorded = trajectory.steps[-1].messages[-1]["content"]
    assert recorded.endswith("\ufffd") and streamed == recorded
