"""The engine dies while the proxy is paused: the resume says so (503, naming the engine), the
held calls fail with 503 instead of hanging, and what they had generated stays recorded."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from dressage.engine.testing import serve_engine
from dressage.proxy.client import ProxyClient, ProxyClientError
from dressage.proxy.tito import TITOTokenizer
from tests.helpers import ENGINE_KEY
from tests.proxy.conftest import running_proxy
from tests.proxy.pause_harness import ADMIN, API, NO_THINK, WireLog

pytestmark = pytest.mark.integration


async def _call(proxy: str, session: str, stream: bool) -> Any:
    client = AsyncOpenAI(base_url=f"{proxy}/sessions/{session}/v1", api_key=API, max_retries=0)
    params: dict[str, Any] = {
        "model": "dressage",
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 2000,
        "extra_body": {**NO_THINK, "ignore_eos": True},
    }
    try:
        if not stream:
            return await client.chat.completions.create(**params)
        async for _ in await client.chat.completions.create(**params, stream=True):
            pass
        return None
    finally:
        await client.close()


def test_engine_dying_while_paused(
    tiny_model_path: Path, qwen35_tito: TITOTokenizer, tmp_path: Path
) -> None:
    with ExitStack() as engine_stack:
        engine_url = engine_stack.enter_context(
            serve_engine(
                tiny_model_path,
                subprocess=True,
                device="cpu",
                num_threads=1,
                context_length=4096,
                admin_api_key=ENGINE_KEY,
            )
        )
        wire = WireLog(engine_url, retries=1, backoff=0.01)
        with running_proxy(
            engine_url, tmp_path / "store", qwen35_tito, engine=wire, admin_key=ADMIN,
            api_key=API, partial_rollout=True, engine_retries=1,
        ) as proxy:  # fmt: skip
            admin = ProxyClient(proxy, admin_key=ADMIN)

            async def scenario() -> None:
                calls = [
                    asyncio.create_task(_call(proxy, "dying-plain", False)),
                    asyncio.create_task(_call(proxy, "dying-stream", True)),
                ]
                while (await admin.pause_state())["in_flight"] < 2:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.5)
                assert (await admin.pause_rollout("update"))["paused_calls"] == 2
                engine_stack.close()  # the engine process is gone
                with pytest.raises(ProxyClientError) as info:
                    await admin.resume_rollout(reason="update")
                assert info.value.status == 503
                assert engine_url in str(info.value) and "2 paused calls" in str(info.value)
                assert not (await admin.pause_state())["paused"], "nothing stays paused"
                plain, streamed = await asyncio.gather(*calls, return_exceptions=True)
                assert isinstance(plain, openai.InternalServerError), plain
                # agents see that the engine failed, never where it runs (the store keeps it)
                assert plain.status_code == 503 and "engine at <engine>" in str(plain)
                assert isinstance(streamed, openai.APIError), streamed
                assert "engine at <engine>" in str(streamed)
                assert engine_url not in str(plain) + str(streamed)
                for session in ("dying-plain", "dying-stream"):
                    (step,) = (await admin.read_trajectory(session)).steps
                    first = wire.answers[f"{step.request_id}-0"]["meta_info"]
                    partial = [int(t[1]) for t in first["output_token_logprobs"]]
                    assert partial and step.output_ids == partial, "the partial output is kept"
                    assert step.finish_reason == "abort"
                    assert engine_url in step.extra["engine_error"]
                await admin.aclose()

            asyncio.run(scenario())
