"""Tool loops through the real OpenAI SDK (sync and async, streaming and not).

The engine is scripted here because a random tiny model never writes a Qwen3.5 tool call; the
tokens are the real tokenizer's, and the checks are on what went over the wire to the engine
(the proxy in front of the real engine is covered in ``test_proxy_e2e.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import APIStatusError, AsyncOpenAI, OpenAI

from dressage.proxy.testing import EngineReply
from dressage.proxy.tito import TITOTokenizer
from dressage.testing.tito_corpus import WEATHER_TOOL
from dressage.trajectory import Segment
from tests.proxy.conftest import TOOL_CALL, Script, scripted_proxy

pytestmark = pytest.mark.integration

THINK = "The user wants the weather.\n</think>\n\n"
CALLING = f"{THINK}Let me check.\n\n{TOOL_CALL}<|im_end|>"
ANSWER = "It will be sunny.\n</think>\n\nSunny for three days.<|im_end|>"
SYSTEM = {"role": "system", "content": "You are a helpful agent."}


def _echo(message: Any) -> dict[str, Any]:
    return dict(message.model_dump(exclude_none=True))


def _tool_result(call: Any, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": text}


def _check_segment(segment: Any, bodies: list[dict[str, Any]], replies: list[EngineReply]) -> None:
    """The segment is the last engine input plus the last output, with outputs trainable."""
    last_input, last_output = bodies[-1]["input_ids"], replies[-1].output_ids
    assert segment.tokens == last_input + last_output
    outputs = {len(b["input_ids"]): len(r.output_ids) for b, r in zip(bodies, replies, strict=True)}
    expected = []
    for start, n in sorted(outputs.items()):
        expected += [0] * (start - len(expected)) + [1] * n
    assert segment.full_loss_mask == expected
    for earlier, later, reply in zip(bodies, bodies[1:], replies, strict=False):
        # append-only: each request starts with everything before it, sampled ids verbatim
        prefix = earlier["input_ids"] + reply.output_ids
        assert later["input_ids"][: len(prefix)] == prefix


def test_sync_tool_loop_is_one_segment(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    plan = script(CALLING, CALLING, ANSWER)
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, _):
        client = OpenAI(base_url=f"{url}/sessions/loop/v1", api_key="unused", max_retries=0)
        messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Paris?"}]
        finishes = []
        for _ in range(3):
            response = client.chat.completions.create(
                model="m", messages=messages, tools=[WEATHER_TOOL], max_tokens=64
            )
            choice = response.choices[0]
            finishes.append(choice.finish_reason)
            messages.append(_echo(choice.message))
            for call in choice.message.tool_calls or ():
                assert call.id.startswith("call_") and call.type == "function"
                assert call.function.name == "get_weather"
                assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
                messages.append(_tool_result(call, "22C, clear"))
            assert response.usage is not None
            assert response.usage.completion_tokens == len(plan.replies[-1].output_ids)
            assert response.usage.prompt_tokens == len(plan.bodies[-1]["input_ids"])
        assert finishes == ["tool_calls", "tool_calls", "stop"]
        assert messages[2]["content"] == "Let me check."
        assert messages[2]["reasoning_content"] == "The user wants the weather."
        assert messages[-1]["content"] == "Sunny for three days."
        for body in plan.bodies:  # the engine is asked for what TITO needs
            assert body["return_logprob"] is True and body["stream"] is False
            assert body["rid"].startswith("chatcmpl-")
            assert set(body["sampling_params"]["stop_token_ids"]) >= set(qwen35_tito.stop_token_ids)
            assert body["sampling_params"]["max_new_tokens"] == 64

        segments = httpx.post(f"{url}/v1/sessions/loop/finalize").json()["segments"]
    assert len(segments) == 1
    (segment,) = segments
    assert segment["finish_reason"] == "stop"
    _check_segment(Segment.from_dict(segment), plan.bodies, plan.replies)
    assert [m["role"] for m in segment["messages"]] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_async_streaming_tool_loop(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script], incremental: bool
) -> None:
    """Through an engine that streams cumulative chunks (SGLang's default) or deltas
    (``--incremental-streaming-output``)."""
    plan = script(CALLING, ANSWER)

    async def agent(url: str) -> list[dict[str, Any]]:
        client = AsyncOpenAI(base_url=f"{url}/sessions/stream/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Paris?"}]
        results = []
        for _ in range(2):
            stream = await client.chat.completions.create(
                model="m",
                messages=messages,
                tools=[WEATHER_TOOL],
                max_tokens=64,
                stream=True,
                stream_options={"include_usage": True},
            )
            got: dict[str, Any] = {"content": "", "reasoning": "", "calls": [], "chunks": 0}
            async for chunk in stream:
                got["chunks"] += 1
                if chunk.usage is not None:
                    got["usage"] = chunk.usage
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                got["content"] += delta.content or ""
                got["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
                got["calls"] += delta.tool_calls or []
                got["finish"] = chunk.choices[0].finish_reason or got.get("finish")
            message: dict[str, Any] = {"role": "assistant", "content": got["content"] or None}
            message["reasoning_content"] = got["reasoning"]
            if got["calls"]:
                message["tool_calls"] = [c.model_dump(exclude={"index"}) for c in got["calls"]]
            messages.append(message)
            for call in got["calls"]:
                messages.append(_tool_result(call, "22C"))
            results.append(got)
        await client.close()
        return results

    # an engine that decodes a token every 10 ms: its chunks reach the proxy one by one (the
    # tokens that arrive together go on in one delta)
    with scripted_proxy(
        plan, tmp_path, qwen35_tito, stream_interval_s=0.01, incremental=incremental
    ) as (url, _):
        first, second = asyncio.run(agent(url))
        trajectory = httpx.get(f"{url}/v1/sessions/stream/trajectory").json()
    assert first["finish"] == "tool_calls" and second["finish"] == "stop"
    assert first["content"] == "Let me check."
    assert first["reasoning"] == "The user wants the weather."
    assert first["chunks"] > 5  # streamed as the tokens come, not in one piece
    (call,) = first["calls"]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert second["content"] == "Sunny for three days."
    assert first["usage"].completion_tokens == len(plan.replies[0].output_ids)
    # what the agent accumulated from deltas is what was recorded: the history extends
    steps = trajectory["steps"]
    assert [s["segment_index"] for s in steps] == [0, 0]
    for step, reply in zip(steps, plan.replies, strict=True):
        assert step["output_ids"] == reply.output_ids
        assert step["output_logprobs"] == [-0.25] * len(reply.output_ids)
    assert steps[1]["boundary_reason"] is None
    for body in plan.bodies:
        assert body["stream"] is True


def test_unparseable_tool_call_comes_back_as_content(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    broken = "<tool_call>\n<function=get_weather>\ncity=Paris\n</tool_call><|im_end|>"
    plan = script(f"{THINK}{broken}")
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, _):
        client = OpenAI(base_url=f"{url}/sessions/broken/v1", api_key="x", max_retries=0)
        response = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Paris?"}], tools=[WEATHER_TOOL]
        )
        (step,) = httpx.get(f"{url}/v1/sessions/broken/trajectory").json()["steps"]
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == broken.removesuffix("<|im_end|>")
    assert step["finish_reason"] == "stop"
    assert step["output_ids"] == plan.replies[0].output_ids


def test_logprobs_of_the_sampled_tokens(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    plan = script(ANSWER)
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, _):
        client = OpenAI(base_url=f"{url}/sessions/lp/v1", api_key="x", max_retries=0)
        response = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Paris?"}], logprobs=True
        )
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    ids = plan.replies[0].output_ids
    assert [t.token for t in logprobs.content] == [qwen35_tito.decode([i]) for i in ids]
    assert [t.logprob for t in logprobs.content] == [-0.25] * len(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_engine_abort_returns_the_partial_output_and_records_it(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script], stream: bool
) -> None:
    partial = EngineReply(qwen35_tito.encode("I was thinking about"), finish="abort")
    plan = script(partial)
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, _):
        client = OpenAI(base_url=f"{url}/sessions/ab/v1", api_key="x", max_retries=0)
        request = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
        if stream:
            chunks = list(client.chat.completions.create(**request, stream=True))
            finish = chunks[-1].choices[0].finish_reason
            reasoning = "".join(
                (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                for c in chunks
                if c.choices
            )
        else:
            choice = client.chat.completions.create(**request).choices[0]
            finish, reasoning = choice.finish_reason, choice.message.reasoning_content  # type: ignore[attr-defined]
        (step,) = httpx.get(f"{url}/v1/sessions/ab/trajectory").json()["steps"]
    assert finish == "abort"
    assert reasoning == "I was thinking about"  # the prompt opened <think>: all of it reasons
    assert step["finish_reason"] == "abort"
    assert step["output_ids"] == partial.output_ids
    assert step["output_logprobs"] == [-0.25] * len(partial.output_ids)


def test_an_abort_with_an_error_status_is_an_error_and_records_nothing(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    plan = script(EngineReply([], finish="abort", status_code=503))
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, _):
        client = OpenAI(base_url=f"{url}/sessions/err/v1", api_key="x", max_retries=0)
        with pytest.raises(APIStatusError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        stats = httpx.get(f"{url}/v1/sessions/err/stats").json()
    assert info.value.status_code == 503
    assert "engine at <engine>" in info.value.message  # its address stays in the log
    assert stats["steps"] == 0 and stats["status"] == "open"
