"""Pydantic AI (``pydantic-ai-slim[openai]``) through the proxy, with its OpenAI chat model.

Its default structured output is a tool (``final_result``) beside the agent's own tools, called
under ``tool_choice: "required"`` (here a capability names the tool per step: ``get_weather``,
then ``final_result``); ``NativeOutput`` is ``response_format`` on the same tools. A second run
continues the first with ``message_history``. Every path run here is append-only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pydantic_ai
import pytest

from tests.proxy.frameworks.conftest import (
    MAX_TOKENS,
    THINKING_OFF,
    Forecast,
    Proxy,
    finish_session,
    get_weather,
)

pytestmark = pytest.mark.integration


def _tool_then_answer() -> Any:
    """A capability that forces ``get_weather`` on a run's first step and the answer after
    (Pydantic AI's per-step ``tool_choice``; only the constraint changes, never the tools)."""
    from pydantic_ai.capabilities import AbstractCapability

    @dataclass
    class ToolThenAnswer(AbstractCapability[Any]):
        def get_model_settings(self) -> Any:
            return lambda ctx: {
                "tool_choice": ["get_weather"] if ctx.run_step <= 1 else ["final_result"]
            }

    return ToolThenAnswer()


def _agent(
    proxy: Proxy, session: str, *, seed: int, output_type: Any = Forecast, **options: Any
) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=proxy.base_url(session), api_key="x")
    settings = {
        "max_tokens": MAX_TOKENS, "parallel_tool_calls": False, "seed": seed,
        "extra_body": THINKING_OFF,
    }  # fmt: skip
    return pydantic_ai.Agent(
        OpenAIChatModel("tiny", provider=provider),
        tools=[get_weather],
        output_type=output_type,
        model_settings=settings,
        retries=4,
        **options,
    )


def test_a_tool_loop_continued_by_message_history_is_one_segment(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "pa-loop", seed=1, capabilities=[_tool_then_answer()])
    first = agent.run_sync("Weather in Paris?")
    second = agent.run_sync("And in Rome?", message_history=first.all_messages())
    assert isinstance(first.output, Forecast) and isinstance(second.output, Forecast)
    report = finish_session(framework_proxy, "pa-loop")
    assert report.boundaries == [] and len(report.steps) == 4
    assert all(s.finish_reason == "tool_calls" for s in report.steps)  # output is a tool too
    called = [c["function"]["name"] for s in report.steps for c in s.messages[-1]["tool_calls"]]
    assert called == ["get_weather", "final_result"] * 2
    assert report.trained_tokens == first.usage.output_tokens + second.usage.output_tokens


def test_streamed_run_is_recorded_as_sent(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "pa-stream", seed=2, capabilities=[_tool_then_answer()])

    async def run() -> Any:
        async with agent.run_stream("Weather in Rome?") as streamed:
            output = await streamed.get_output()
            return output, streamed.usage

    output, usage = asyncio.run(run())
    assert isinstance(output, Forecast)
    report = finish_session(framework_proxy, "pa-stream")
    assert report.boundaries == [] and len(report.steps) == 2
    assert report.trained_tokens == usage.output_tokens


def test_native_structured_output_keeps_the_tools(framework_proxy: Proxy) -> None:
    """``NativeOutput`` over two runs, ``tool_choice: "none"`` (the random model would otherwise
    go on calling tools): the tools are still sent and rendered, the history grows."""
    agent = _agent(
        framework_proxy, "pa-native", seed=3, output_type=pydantic_ai.NativeOutput(Forecast)
    )
    none = {**agent.model_settings, "tool_choice": "none"}
    first = agent.run_sync("Weather in Paris?", model_settings=none)
    second = agent.run_sync("And Rome?", message_history=first.all_messages(), model_settings=none)
    assert isinstance(first.output, Forecast) and isinstance(second.output, Forecast)
    report = finish_session(framework_proxy, "pa-native")
    assert report.boundaries == [] and len(report.steps) == 2
    assert all(s.finish_reason == "stop" for s in report.steps)  # the JSON answers
    assert report.trained_tokens == first.usage.output_tokens + second.usage.output_tokens
