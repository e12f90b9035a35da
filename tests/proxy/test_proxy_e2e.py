"""End to end: the real OpenAI SDK → the proxy → the real embedded engine.

Every ``/generate`` the proxy sends and every answer it gets are logged off the wire (a thin
subclass of the engine client), and what the proxy recorded is compared with them token for
token; the engine is also asked again, greedily, to reproduce a recorded output from the
recorded prompt. The tiny random model writes no tool calls (``test_proxy_tools.py`` covers
those with a scripted engine); here every call still carries tools, so the rendered prompts are
the real agent ones.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from dressage.proxy.client import SyncProxyClient
from dressage.proxy.engine_client import EngineClient, PromptIds
from dressage.proxy.tito import TITOTokenizer
from dressage.testing.tito_corpus import WEATHER_TOOL
from dressage.trajectory import Segment, StepRecord
from tests.helpers import ENGINE_KEY, bearer
from tests.proxy.conftest import running_proxy
from tests.proxy.wire_log import WireLog

pytestmark = pytest.mark.integration

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
SYSTEM = {"role": "system", "content": "You are a weather agent. Use the tools."}


@pytest.fixture(scope="module")
def engine_weight_version() -> str:
    return "3"  # a version other than the default 0, for the version checks below


@pytest.fixture(scope="module")
def proxy(
    engine_url: str, tmp_path_factory: pytest.TempPathFactory, qwen35_tito: TITOTokenizer
) -> Iterator[tuple[str, WireLog]]:
    wire = WireLog(engine_url)
    store = tmp_path_factory.mktemp("store")
    with running_proxy(
        engine_url, store, qwen35_tito, engine=wire, record_token_versions=True
    ) as url:
        yield url, wire


def _check_wire(steps: list[StepRecord], wire: WireLog) -> None:
    """Each recorded step is exactly one engine exchange: prompt = segment so far + delta."""
    answers = {a["meta_info"]["id"]: a for a in wire.answers}  # SGLang echoes the rid as id
    exchanges = {q["rid"].rsplit("-", 1)[0]: (q, answers[q["rid"]]) for q in wire.requests}
    segment_tokens: dict[int, list[int]] = {}
    for step in steps:
        request, answer = exchanges[step.request_id]
        before = segment_tokens.setdefault(step.segment_index, [])
        assert step.prefix_length == len(before)
        assert request["input_ids"] == before + step.prompt_delta_ids
        assert request["return_logprob"] is True
        meta = answer["meta_info"]
        assert step.output_ids == answer["output_ids"]
        assert step.output_ids == [t[1] for t in meta["output_token_logprobs"]]
        assert step.output_logprobs == [t[0] for t in meta["output_token_logprobs"]]
        assert step.output_versions == [3] * len(step.output_ids)  # weight_version "3"
        before += step.prompt_delta_ids + step.output_ids


def _check_segment(segment: Segment, steps: list[StepRecord]) -> None:
    mine = [s for s in steps if s.segment_index == segment.segment_index]
    assert segment.tokens == [t for s in mine for t in s.prompt_delta_ids + s.output_ids]
    mask = [m for s in mine for m in [0] * len(s.prompt_delta_ids) + [1] * len(s.output_ids)]
    assert segment.full_loss_mask == mask
    assert segment.prompt_length == len(mine[0].prompt_delta_ids)
    assert segment.full_versions == [3 if m else -1 for m in mask]
    assert segment.full_logprobs == [
        lp for s in mine for lp in [0.0] * len(s.prompt_delta_ids) + s.output_logprobs
    ]


def test_sync_multi_turn_agent_records_what_the_engine_saw(
    proxy: tuple[str, WireLog], engine_url: str
) -> None:
    url, wire = proxy
    client = OpenAI(base_url=f"{url}/sessions/e2e-sync/v1", api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Weather in Paris?"}]
    for turn in range(3):
        response = client.chat.completions.create(
            model="tiny", messages=messages, tools=[WEATHER_TOOL], max_tokens=8,  # type: ignore[arg-type,list-item]
            temperature=0, extra_body=NO_THINK,
        )  # fmt: skip
        choice = response.choices[0]
        assert choice.finish_reason in ("length", "stop")
        assert response.model == "tiny" and response.id.startswith("chatcmpl-")
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"Go on ({turn})."})

    admin = SyncProxyClient(url)
    trajectory = admin.read_trajectory("e2e-sync")
    assert len(trajectory.steps) == 3 and trajectory.segments == []  # still open
    _check_wire(trajectory.steps, wire)
    (segment,) = admin.finalize_session("e2e-sync")
    _check_segment(segment, trajectory.steps)
    assert segment.extra_info["record_token_versions"] is True
    assert segment.extra_info["weight_versions"] == [3]
    assert segment.messages[0] == SYSTEM and len(segment.messages) == 2 + 3 * 2 - 1

    # the engine itself, asked again greedily with the recorded prompt, samples the same ids
    first = trajectory.steps[0]
    again = httpx.post(
        f"{engine_url}/generate",
        json={
            "input_ids": first.prompt_delta_ids,
            "sampling_params": {"max_new_tokens": len(first.output_ids), "temperature": 0},
            "return_logprob": True,
        },
        timeout=60,
    ).json()
    assert again["output_ids"] == first.output_ids


def test_async_streaming_matches_what_was_recorded(proxy: tuple[str, WireLog]) -> None:
    url, wire = proxy
    question = [{"role": "user", "content": "Stream me a forecast."}]

    async def run() -> tuple[str, str, Any, Any]:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="tiny", messages=question, max_tokens=12, temperature=0, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "e2e-s"},
        )  # fmt: skip
        content = reasoning = ""
        usage = finish = None
        async for chunk in stream:
            usage = chunk.usage or usage
            if chunk.choices:
                delta = chunk.choices[0].delta
                content += delta.content or ""
                reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                finish = chunk.choices[0].finish_reason or finish
        plain = await client.chat.completions.create(
            model="tiny", messages=question, max_tokens=12, temperature=0,  # type: ignore[arg-type]
            extra_headers={"X-Session-Id": "e2e-ns"},
        )  # fmt: skip
        await client.close()
        return content, reasoning, (usage, finish), plain

    content, reasoning, (usage, finish), plain = asyncio.run(run())
    (step,) = SyncProxyClient(url).read_trajectory("e2e-s").steps
    recorded = step.messages[-1]
    assert content == (recorded.get("content") or "")
    assert reasoning == (recorded.get("reasoning_content") or "")
    assert finish == "length" and usage.completion_tokens == 12
    # greedy: streaming and not streaming give the same answer
    assert (plain.choices[0].message.content or "") == content
    _check_wire([step], wire)
    assert [q["stream"] for q in wire.requests if q["rid"].startswith(step.request_id)] == [True]


def test_a_compacting_agent_yields_two_segments_with_correct_masks(
    proxy: tuple[str, WireLog],
) -> None:
    url, wire = proxy
    client = OpenAI(base_url=f"{url}/sessions/e2e-compact/v1", api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Plan a trip."}]

    def call() -> None:
        response = client.chat.completions.create(
            model="tiny", messages=messages, tools=[WEATHER_TOOL], max_tokens=6,  # type: ignore[arg-type,list-item]
            temperature=0, extra_body=NO_THINK,
        )  # fmt: skip
        messages.append(response.choices[0].message.model_dump(exclude_none=True))

    call()
    messages.append({"role": "user", "content": "Add Rome."})
    call()
    # the agent's context is full: it replaces its history with a summary and goes on
    messages[:] = [SYSTEM, {"role": "user", "content": "Summary so far: Paris, Rome. Go on."}]
    call()
    messages.append({"role": "user", "content": "Thanks."})
    call()

    admin = SyncProxyClient(url)
    steps = admin.read_trajectory("e2e-compact").steps
    segments = admin.finalize_session("e2e-compact")
    assert [s.segment_index for s in steps] == [0, 0, 1, 1]
    assert steps[2].boundary_reason == "messages_removed" and steps[2].prefix_length == 0
    first, second = segments
    assert first.finish_reason == "segment_boundary"
    assert first.extra_info["boundary_reason"] == "messages_removed"
    assert second.finish_reason == steps[-1].finish_reason
    for segment in segments:
        _check_segment(segment, steps)
    _check_wire(steps, wire)
    # the new segment starts with the compacted conversation rendered whole
    assert second.messages[:2] == [
        SYSTEM,
        {"role": "user", "content": "Summary so far: Paris, Rome. Go on."},
    ]
    assert sum(second.full_loss_mask) == len(steps[2].output_ids) + len(steps[3].output_ids)


def test_an_engine_abort_mid_call_is_answered_and_recorded(
    proxy: tuple[str, WireLog], engine_url: str
) -> None:
    url, _ = proxy
    client = OpenAI(base_url=f"{url}/sessions/e2e-abort/v1", api_key="x", max_retries=0)
    result: dict[str, Any] = {}

    def agent() -> None:
        result["response"] = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Talk."}],  # type: ignore[list-item]
            max_tokens=3000, extra_body={"ignore_eos": True, **NO_THINK},
        )  # fmt: skip

    thread = threading.Thread(target=agent)
    thread.start()
    time.sleep(0.8)  # generating by now
    abort = httpx.post(
        f"{engine_url}/abort_request", json={"abort_all": True}, headers=bearer(ENGINE_KEY)
    )
    abort.raise_for_status()
    thread.join(timeout=60)
    choice = result["response"].choices[0]
    (step,) = SyncProxyClient(url).read_trajectory("e2e-abort").steps
    assert choice.finish_reason == "abort"
    assert step.finish_reason == "abort"
    assert 0 < len(step.output_ids) < 3000
    assert result["response"].usage.completion_tokens == len(step.output_ids)
    assert step.extra["engine_finish"]["type"] == "abort"


def test_the_engine_client_against_the_embedded_engine(engine_url: str) -> None:
    client = EngineClient(engine_url, admin_key=ENGINE_KEY)  # /workers is a control path
    prompt = PromptIds.of([248045, 846, 198, 14556, 248046, 198, 248045, 74455, 198])
    greedy = {"max_new_tokens": 6, "temperature": 0}

    async def run() -> tuple[Any, list[Any], list[str], str]:
        plain = await client.generate(prompt, greedy, rid="direct-1", routing_key="s")
        streamed = [o async for o in client.generate_stream(prompt, greedy, rid="direct-2")]
        workers = await client.workers()
        version = await client.weight_version()
        await client.aclose()
        return plain, streamed, workers, version

    plain, streamed, workers, version = asyncio.run(run())
    assert [i for o in streamed for i in o.output_ids] == plain.output_ids
    assert [lp for o in streamed for lp in o.logprobs] == plain.logprobs
    assert streamed[-1].finish == plain.finish == {"type": "length", "length": 6}
    assert plain.versions == [3] * 6 and version == "3"
    assert workers == [engine_url]  # a plain server: /workers is 404


def test_stream_interval_asks_the_engine_for_fewer_larger_chunks(
    engine_url: str, tmp_path: Path, qwen35_tito: TITOTokenizer
) -> None:
    """``--stream-interval 4``: a streamed call asks the engine for a chunk every 4 tokens (the
    embedded engine honours SGLang's per-request ``stream_interval``), a whole call asks
    nothing, and the agent's streamed message is still the recorded one."""
    wire = WireLog(engine_url)

    async def run(url: str) -> str:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        content = ""
        for sid, stream in (("si-s", True), ("si-w", False)):
            if not stream:
                await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "Go."}], max_tokens=12,  # type: ignore[arg-type]
                    temperature=0, extra_headers={"X-Session-Id": sid},
                )  # fmt: skip
                continue
            events = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Go."}], max_tokens=12,  # type: ignore[arg-type]
                temperature=0, stream=True, extra_headers={"X-Session-Id": sid},
                extra_body=NO_THINK,
            )  # fmt: skip
            async for chunk in events:
                if chunk.choices:
                    content += chunk.choices[0].delta.content or ""
        await client.close()
        return content

    counted: list[int] = []
    original = wire._chunks

    async def counting(lines: Any, rid: str) -> Any:
        async for out in original(lines, rid):
            counted.append(len(out.output_ids))
            yield out

    wire._chunks = counting  # type: ignore[method-assign]
    with running_proxy(engine_url, tmp_path, qwen35_tito, engine=wire, stream_interval=4) as url:
        content = asyncio.run(run(url))
        (step,) = SyncProxyClient(url).read_trajectory("si-s").steps
    streamed, whole = wire.requests
    assert streamed["stream"] is True and streamed["sampling_params"]["stream_interval"] == 4
    assert whole["stream"] is False and "stream_interval" not in whole["sampling_params"]
    assert counted == [4, 4, 4], "12 tokens came in 3 chunks of 4"
    assert content == (step.messages[-1].get("content") or "")
    assert len(step.output_ids) == 12


def test_stream_coalescing_hands_on_fewer_larger_chunks_and_records_the_same(
    engine_url: str, tmp_path: Path, qwen35_tito: TITOTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--stream-coalesce-ms 500``: the engine streams a chunk a token, the proxy reads what
    arrived in each window as one (from its last cumulative chunk), and the agent's streamed
    message and the recorded tokens are what a whole call of the same greedy turn gives."""
    counted: list[int] = []
    original = EngineClient._chunks

    async def counting(self: EngineClient, batches: Any, rid: str) -> Any:
        assert self.stream_coalesce == 0.5
        async for out in original(self, batches, rid):
            counted.append(len(out.output_ids))
            yield out

    async def run(url: str) -> tuple[str, str]:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "Go."}],
               "max_tokens": 24, "temperature": 0, "extra_body": NO_THINK}  # fmt: skip
        events = await client.chat.completions.create(
            **ask, stream=True, extra_headers={"X-Session-Id": "co-s"}
        )
        content = ""
        async for chunk in events:
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
        whole = await client.chat.completions.create(**ask, extra_headers={"X-Session-Id": "co-w"})
        await client.close()
        return content, whole.choices[0].message.content or ""

    monkeypatch.setattr(EngineClient, "_chunks", counting)
    with running_proxy(engine_url, tmp_path, qwen35_tito, stream_coalesce_ms=500) as url:
        content, whole_content = asyncio.run(run(url))
        (streamed_step,) = SyncProxyClient(url).read_trajectory("co-s").steps
        (whole_step,) = SyncProxyClient(url).read_trajectory("co-w").steps
    assert sum(counted) == 24
    assert counted[0] == 1, "the first chunk is not held back"
    assert len(counted) < 12, f"24 chunks read as {len(counted)}"
    assert streamed_step.output_ids == whole_step.output_ids
    assert streamed_step.output_logprobs == pytest.approx(whole_step.output_logprobs, abs=1e-4)
    assert streamed_step.output_versions == whole_step.output_versions
    assert content == whole_content == (streamed_step.messages[-1].get("content") or "")
