"""Hooks of the async-driver tests, loaded by dotted path: a two-turn OpenAI-SDK agent run
against the proxy in a fresh session (the shape of blackbox_dispatch.generate), with a slow
"tool" between its turns as real agents have, and a reward."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from openai import AsyncOpenAI

from dressage.proxy.client import ProxyClient
from dressage.rollout.multi_segment import expand_segments_to_samples
from dressage.types import Sample

ADMIN = "admin-key-for-driver-tests"
SESSIONS: list[str] = []
"""Every session an agent opened (the tests read their trajectories back)."""
MAX_TOKENS = 32
TOOL_SECONDS = 0.1
# The tiny random model almost never samples its end token, so every call runs MAX_TOKENS long:
# calls, not the tool, fill an agent's time, and a weight update finds calls in flight. The
# tool's time differs by sample (1x to 4x), so that the agents do not all sit in their tools at
# once: with the same time, the calls of a rollout ended together, and in one CI run each of the
# three updates came within 0.2 s after such an end, with no call in flight.


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> list[Sample]:
    session = f"rollout-{sample.index}-{uuid.uuid4().hex[:8]}"
    proxy = args.dressage_proxy_url
    SESSIONS.append(session)
    client = AsyncOpenAI(base_url=f"{proxy}/sessions/{session}/v1", api_key=ADMIN, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": str(sample.prompt)}]
    try:
        for _ in range(2):
            response = await client.chat.completions.create(
                model="dressage",
                messages=messages,
                max_tokens=MAX_TOKENS,
                temperature=sampling_params["temperature"],
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            content = response.choices[0].message.content or ""
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": "?"},
            ]
            await asyncio.sleep(TOOL_SECONDS * (1 + sample.index % 4))
    finally:
        await client.close()
    async with ProxyClient(proxy, admin_key=ADMIN) as admin:
        segments = await admin.finalize_session(session)
    return expand_segments_to_samples(sample, segments, args=args)


async def reward(args: Any, samples: list[Sample]) -> list[float]:
    """A learnable signal: the share of even token ids in the response."""
    out = []
    for sample in samples:
        response = sample.tokens[len(sample.tokens) - sample.response_length :]
        out.append(sum(t % 2 == 0 for t in response) / max(len(response), 1))
    return out
