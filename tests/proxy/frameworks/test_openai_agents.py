"""OpenAI Agents SDK (``openai-agents``) through the proxy, with its Chat Completions model.

Its history is append-only in every path run here: a tool call goes back as the assistant's
``tool_calls``, a failed tool as a ``tool`` message carrying the error, a structured answer is
``response_format`` on the same tools. ``tool_choice="required"`` holds for the first call of a
run only (``reset_tool_choice``, on by default), so each run is a tool call, then a text answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import agents
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


def _agent(proxy: Proxy, session: str, *, seed: int, **options: Any) -> Any:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=proxy.base_url(session), api_key="x", max_retries=0)
    settings = agents.ModelSettings(
        tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS,
        include_usage=True, extra_body={**THINKING_OFF, "seed": seed},
    )  # fmt: skip
    return agents.Agent(
        name="weather",
        instructions="Answer with the tools.",
        tools=[agents.function_tool(get_weather)],
        model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        model_settings=settings,
        **options,
    )


def test_a_two_run_tool_loop_is_one_segment(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "oa-loop", seed=1)
    first = agents.Runner.run_sync(agent, "Weather in Paris?", max_turns=4)
    history = [*first.to_input_list(), {"role": "user", "content": "And in Rome?"}]
    second = agents.Runner.run_sync(agent, history, max_turns=4)
    report = finish_session(framework_proxy, "oa-loop")
    assert report.boundaries == []
    assert len(report.steps) == 4  # per run: the required tool call, then the text answer
    assert report.steps[0].finish_reason == report.steps[2].finish_reason == "tool_calls"
    used = first.context_wrapper.usage.output_tokens + second.context_wrapper.usage.output_tokens
    assert report.trained_tokens == used


def test_streamed_run_is_recorded_as_sent(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "oa-stream", seed=2)

    async def run() -> Any:
        result = agents.Runner.run_streamed(agent, "Weather in Rome?", max_turns=4)
        deltas = [e async for e in result.stream_events() if e.type == "raw_response_event"]
        assert deltas, "nothing was streamed"
        return result

    result = asyncio.run(run())
    report = finish_session(framework_proxy, "oa-stream")
    assert report.boundaries == [] and len(report.steps) == 2
    assert report.trained_tokens == result.context_wrapper.usage.output_tokens


def test_structured_output_keeps_the_tools(framework_proxy: Proxy) -> None:
    """A tool run, then the same agent asked for a Forecast (``tool_choice="none"``: the random
    model would otherwise go on calling tools): the tools stay, the history grows."""
    agent = _agent(framework_proxy, "oa-structured", seed=3)
    first = agents.Runner.run_sync(agent, "Weather in Paris?", max_turns=4)
    settings = agent.model_settings.resolve(agents.ModelSettings(tool_choice="none"))
    answer = agent.clone(output_type=Forecast, model_settings=settings)
    history = [*first.to_input_list(), {"role": "user", "content": "As a forecast, please."}]
    second = agents.Runner.run_sync(answer, history, max_turns=2)
    assert isinstance(second.final_output, Forecast)
    report = finish_session(framework_proxy, "oa-structured")
    assert report.boundaries == [] and len(report.steps) == 3
    assert report.steps[-1].finish_reason == "stop"  # the JSON answer
    used = first.context_wrapper.usage.output_tokens + second.context_wrapper.usage.output_tokens
    assert report.trained_tokens == used
