"""Partial rollout under load: 32 agents on the real embedded engine, 5 pause/update/resume cycles.

Every agent call must succeed; every recorded step must hold exactly what the engine produced
for its call across its engine requests (checked against the wire); every token must carry the
version of the weights that produced it (checked against a fresh forward of each checkpoint);
the agent must have seen exactly the recorded tokens; and the finalized segments must carry
their versions into samples, with ``--mask-nonlast-version-tokens`` masking the stale ones.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from openai import AsyncOpenAI

from dressage.proxy.client import ProxyClient
from dressage.proxy.tito import TITOTokenizer
from dressage.rollout.multi_segment import expand_segments_to_samples
from dressage.trajectory import NO_VERSION
from dressage.types import Sample
from tests.proxy.conftest import running_proxy
from tests.proxy.pause_harness import (
    ADMIN,
    API,
    NO_THINK,
    VersionOracle,
    WireLog,
    check_step_against_wire,
    perturbed_checkpoints,
    update_engine,
)

pytestmark = pytest.mark.integration

SESSIONS = 32
CYCLES = 5
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def weights(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Version -> checkpoint: 0 is the tiny model, then two perturbed copies in turn."""
    a, b = perturbed_checkpoints(tiny_model_path, tmp_path_factory.mktemp("pause-weights"), 2)
    return {0: tiny_model_path, **{v: a if v % 2 else b for v in range(1, CYCLES + 1)}}


async def _agent(
    proxy: str, i: int, done: asyncio.Event, streamed: list[int]
) -> list[dict[str, Any]]:
    """A plain OpenAI-SDK agent: chats until the weight updates are over (2..12 turns).

    A streaming agent counts the content chunks it receives in ``streamed[0]``, so that the
    controller pauses only once the current weights have produced tokens.
    """
    client = AsyncOpenAI(base_url=f"{proxy}/sessions/pause-{i}/v1", api_key=API, max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": f"Task {i}: list some numbers."},
    ]
    stream = i % 2 == 1
    calls = []
    for turn in range(12):
        if turn >= 2 and done.is_set():
            break
        params: dict[str, Any] = {
            "model": "dressage",
            "messages": messages,
            "max_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "seed": 1000 * i + turn,
            "extra_body": NO_THINK,
        }
        if stream:
            content, finish, usage = "", None, None
            chunks = await client.chat.completions.create(
                **params, stream=True, stream_options={"include_usage": True}
            )
            async for chunk in chunks:
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    streamed[0] += bool(choice.delta.content)
                    finish = choice.finish_reason or finish
        else:
            response = await client.chat.completions.create(**params)
            content = response.choices[0].message.content or ""
            finish = response.choices[0].finish_reason
            usage = response.usage.completion_tokens if response.usage else None
        calls.append({"content": content, "finish": finish, "completion_tokens": usage})
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"Go on ({turn})."},
        ]
    await client.close()
    return calls


async def _run(proxy: str, engine_url: str, weights: dict[int, Path]) -> dict[str, Any]:
    admin = ProxyClient(proxy, admin_key=ADMIN)
    done = asyncio.Event()
    pauses: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    streamed = [0]

    async def controller() -> None:
        for version in range(1, CYCLES + 1):
            # Under load the first tokens can take longer than any fixed wait: pause only once
            # the weights of this version have streamed tokens and calls are in flight.
            mark = streamed[0]
            while streamed[0] - mark < 8 or (await admin.pause_state())["in_flight"] < 8:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.15)  # mid-generation: the calls have produced tokens
            pauses.append(await admin.pause_rollout(f"update {version}"))
            await asyncio.to_thread(update_engine, engine_url, weights[version], version)
            resumes.append(await admin.resume_rollout(version, f"update {version}"))
            await asyncio.sleep(0.2)
        done.set()

    agents = [_agent(proxy, i, done, streamed) for i in range(SESSIONS)]
    _, *calls = await asyncio.wait_for(asyncio.gather(controller(), *agents), timeout=240)
    trajectories = {}
    for i in range(SESSIONS):
        await admin.finalize_session(f"pause-{i}")
        trajectories[i] = await admin.read_trajectory(f"pause-{i}")
    await admin.aclose()
    return {"pauses": pauses, "resumes": resumes, "calls": calls, "trajectories": trajectories}


@pytest.fixture(scope="module")
def run(
    engine_url: str,
    weights: dict[int, Path],
    qwen35_tito: TITOTokenizer,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("pause-store")
    wire = WireLog(engine_url, retries=0)
    with running_proxy(
        engine_url,
        store,
        qwen35_tito,
        engine=wire,
        admin_key=ADMIN,
        api_key=API,
        partial_rollout=True,
        record_token_versions=True,
        mask_nonlast_version_tokens=True,
    ) as proxy:
        result = asyncio.run(_run(proxy, engine_url, weights))
    return result | {"wire": wire}


def test_every_pause_stopped_generation_and_every_call_succeeded(run: dict[str, Any]) -> None:
    pauses, resumes = run["pauses"], run["resumes"]
    assert len(pauses) == len(resumes) == CYCLES
    for k, (pause, resume) in enumerate(zip(pauses, resumes, strict=True)):
        assert pause["paused"] and not pause["already_paused"] and pause["mode"] == "abort"
        assert pause["in_flight_at_pause"] >= 4 and pause["paused_calls"] >= 1, pause
        assert resume["resumed"] and resume["weight_version"] == k + 1, resume
        assert resume["engine_weight_version"] == k + 1
        assert resume["released_calls"] >= pause["paused_calls"]
    calls = [c for agent in run["calls"] for c in agent]
    assert len(calls) >= 2 * SESSIONS
    assert {c["finish"] for c in calls} <= {"stop", "length"}, "no call may end aborted"


def test_recorded_tokens_are_exactly_what_the_engine_produced(run: dict[str, Any]) -> None:
    wire, resumed = run["wire"], 0
    for i, trajectory in run["trajectories"].items():
        calls = run["calls"][i]
        assert len(trajectory.steps) == len(calls), f"session pause-{i}: a call is missing"
        for step, call in zip(trajectory.steps, calls, strict=True):
            requests = check_step_against_wire(step, wire, keep_partial=True)
            assert step.extra.get("pauses", 0) == requests - 1
            resumed += requests - 1
            # The agent saw exactly the recorded tokens: no token lost or sent twice.
            assert call["completion_tokens"] == len(step.output_ids)
            assistant = step.messages[-1]
            assert assistant["role"] == "assistant"
            assert call["content"] == (assistant.get("content") or "")
    assert resumed == sum(r["released_calls"] for r in run["resumes"])
    assert resumed >= CYCLES


def test_every_token_carries_the_version_of_the_weights_that_made_it(
    run: dict[str, Any], weights: dict[int, Path]
) -> None:
    steps = [s for t in run["trajectories"].values() for s in t.steps]
    seen = {v for s in steps for v in s.output_versions}
    assert seen == set(range(CYCLES + 1))
    for step in steps:
        assert step.output_versions == sorted(step.output_versions), "versions only grow"
    spanning = [s for s in steps if len(set(s.output_versions)) > 1]
    assert len(spanning) >= CYCLES
    # under load every call can span a pause (CI saw none left): check what single-version ones
    # there are, up to 4
    single = [s for s in steps if s not in spanning]
    others = random.Random(0).sample(single, min(4, len(single)))
    oracle = VersionOracle(weights)
    tokens = distinct = 0
    for step in spanning[:16] + others:
        prompt = run["wire"].requests[f"{step.request_id}-0"]["input_ids"]
        n, d = oracle.check(step, prompt)
        tokens, distinct = tokens + n, distinct + d
    assert distinct > 0.9 * tokens, "the checkpoints must be told apart by the oracle"


def test_segments_and_samples_carry_versions_and_mask_stale_tokens(run: dict[str, Any]) -> None:
    spanning = 0
    for i, trajectory in run["trajectories"].items():
        segments = trajectory.segments
        template = Sample(index=i, group_index=i, prompt="task")
        samples = expand_segments_to_samples(template, segments, args=SimpleNamespace())
        for segment, sample in zip(segments, samples, strict=True):
            assert segment.full_versions is not None
            generated = [v for v in segment.full_versions if v != NO_VERSION]
            spans = segment.extra_info["version_spans"]
            assert [v for v, s, e in spans for _ in range(s, e)] == generated
            if len(set(generated)) < 2:
                continue
            spanning += 1
            assert segment.extra_info["pauses"] >= 1
            latest = max(generated)
            response_versions = segment.full_versions[segment.prompt_length :]
            trainable = segment.full_loss_mask[segment.prompt_length :]
            pairs = zip(trainable, response_versions, strict=True)
            expected = [m if v == latest else 0 for m, v in pairs]
            assert sample.loss_mask == expected
            assert sample.metadata["dressage_partial_rollout"] is True
            assert sample.metadata["dressage_end_token_version"] == latest
            assert 0 < sample.metadata["dressage_masked_stale_tokens"] < sum(trainable)
    assert spanning >= 1
