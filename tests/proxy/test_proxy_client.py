"""``ProxyClient`` (async) and ``SyncProxyClient``: the same calls, the same answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from dressage.proxy.client import ProxyClient, ProxyClientError, SyncProxyClient, Trajectory
from dressage.proxy.testing import EngineReply
from dressage.proxy.tito import TITOTokenizer
from dressage.testing.tito_corpus import WEATHER_TOOL
from dressage.trajectory import Segment
from tests.proxy.conftest import TOOL_CALL, Script, scripted_proxy

pytestmark = pytest.mark.integration

ADMIN = "client-admin-key"
CALL, ANSWER = f"x\n</think>\n\n{TOOL_CALL}<|im_end|>", "y\n</think>\n\nSunny.<|im_end|>"


class ToolAgentModel(Script):
    """Calls the tool until the prompt holds a tool response, then answers."""

    def __call__(self, body: dict[str, Any]) -> EngineReply:
        (response_id,) = self.tito.encode("<tool_response>")
        return self.reply(ANSWER if response_id in body["input_ids"] else CALL)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, qwen35_tito: TITOTokenizer) -> Iterator[str]:
    script = ToolAgentModel(qwen35_tito, CALL)
    store = tmp_path_factory.mktemp("store")
    # this module also runs the store in its fsync mode
    with scripted_proxy(script, store, qwen35_tito, admin_key=ADMIN, store_fsync=True) as (url, _):
        yield url


def _loop_sync(proxy: SyncProxyClient, session: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Paris?"}]
    first = proxy.chat_completions(session, messages, tools=[WEATHER_TOOL], max_tokens=64)
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "22C"}]
    second = proxy.chat_completions(session, messages, tools=[WEATHER_TOOL], max_tokens=64)
    return [first, second]


def test_sync_client(proxy: str) -> None:
    with SyncProxyClient(proxy, admin_key=ADMIN) as client:
        assert client.session_base_url("s1") == f"{proxy}/sessions/s1/v1"
        first, second = _loop_sync(client, "sync-1")
        assert first["choices"][0]["finish_reason"] == "tool_calls"
        assert second["choices"][0]["message"]["content"] == "Sunny."
        trajectory = client.read_trajectory("sync-1")
        assert isinstance(trajectory, Trajectory) and trajectory.status == "open"
        assert [s.finish_reason for s in trajectory.steps] == ["tool_calls", "stop"]
        assert client.session_stats("sync-1")["steps"] == 2
        (segment,) = client.finalize_session("sync-1")
        assert isinstance(segment, Segment) and segment.finish_reason == "stop"
        capabilities = client.capabilities()
        assert capabilities["tito_model"] == "qwen3.5" and capabilities["streaming"] is True
        assert capabilities["pause_resume"] is True and capabilities["store_fsync"] is True
        client.chat_completions("sync-2", [{"role": "user", "content": "x"}], max_tokens=4)
        assert client.discard_session("sync-2") == 1
        assert client.stats()["sessions"]["discarded"] >= 1
        with pytest.raises(ProxyClientError) as info:
            client.finalize_session("never-seen")
        assert info.value.status == 404 and "never-seen is unknown" in str(info.value)
        with pytest.raises(ValueError, match="non-streaming"):
            client.chat_completions("s", [{"role": "user", "content": "x"}], stream=True)
    # an unmodified OpenAI agent on the session's base URL lands in the same session
    agent = OpenAI(base_url=SyncProxyClient(proxy).session_base_url("sdk"), api_key="-")
    agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert SyncProxyClient(proxy, admin_key=ADMIN).read_trajectory("sdk").steps[0].session_id == (
        "sdk"
    )


def test_async_client(proxy: str) -> None:
    async def run() -> tuple[Any, ...]:
        async with ProxyClient(proxy, admin_key=ADMIN) as client:
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Paris?"}]
            first = await client.chat_completions("async-1", messages, tools=[WEATHER_TOOL])
            trajectory = await client.read_trajectory("async-1")
            segments = await client.finalize_session("async-1")
            await client.chat_completions("async-2", messages)
            discarded = await client.discard_session("async-2")
            capabilities = await client.capabilities()
            with pytest.raises(ProxyClientError) as info:
                await client.read_trajectory("missing")
            return first, trajectory, segments, discarded, capabilities, info.value

    first, trajectory, segments, discarded, capabilities, error = asyncio.run(run())
    assert first["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert len(trajectory.steps) == 1 and trajectory.steps[0].session_id == "async-1"
    assert [s.finish_reason for s in segments] == ["tool_calls"]
    assert discarded == 1 and capabilities["model"] == "dressage"
    assert error.status == 404


def test_closing_a_session_again_is_not_counted_again(proxy: str) -> None:
    with SyncProxyClient(proxy, admin_key=ADMIN) as client:
        before = client.stats()["counters"]
        for session in ("twice-final", "twice-discard"):
            client.chat_completions(session, [{"role": "user", "content": "x"}], max_tokens=4)
        first = client.finalize_session("twice-final")
        assert client.finalize_session("twice-final") == first  # the same segments again
        assert client.discard_session("twice-discard") == 1
        assert client.discard_session("twice-discard") == 1
        after = client.stats()["counters"]
    assert after.get("finalized", 0) - before.get("finalized", 0) == 1
    assert after.get("discarded", 0) - before.get("discarded", 0) == 1
