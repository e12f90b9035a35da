"""LangGraph's prebuilt ReAct agent (``langgraph``) over LangChain's ``ChatOpenAI``
(``langchain-openai``) through the proxy.

The model is chosen per step (LangGraph's dynamic model): ``tool_choice: "required"`` until a
tool has answered, then ``"none"``, so each run is a tool call and a text answer; the tools
bound never change. The tool loop and streaming are append-only. The structured answer of
``response_format`` is a separate call through ``with_structured_output``, which binds no
tools: that call starts a new segment (``tools_changed``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.proxy.frameworks.conftest import (
    MAX_TOKENS,
    THINKING_OFF,
    Forecast,
    Proxy,
    finish_session,
    get_weather,
)

pytestmark = [
    pytest.mark.integration,
    # the prebuilt agent moved to the `langchain` package, which is not installed here
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved"),
]


def _agent(proxy: Proxy, session: str, *, seed: int, **options: Any) -> Any:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    weather = tool(get_weather)
    chat = ChatOpenAI(
        model="tiny", base_url=proxy.base_url(session), api_key="x", max_retries=0,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS, seed=seed, extra_body=THINKING_OFF, stream_usage=True,  # type: ignore[call-arg]
        streaming=options.pop("streaming", False),
    )  # fmt: skip

    def pick(state: Any, runtime: Any) -> Any:
        answered = isinstance(state["messages"][-1], ToolMessage)
        return chat.bind_tools(
            [weather], tool_choice="none" if answered else "required",
            parallel_tool_calls=False, strict=True,
        )  # fmt: skip

    return create_react_agent(pick, [weather], **options)


def _output_tokens(messages: list[Any]) -> int:
    return sum((m.usage_metadata or {}).get("output_tokens", 0) for m in messages if m.type == "ai")


def test_a_two_run_react_loop_is_one_segment(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "lg-loop", seed=1)
    state = agent.invoke({"messages": [("user", "Weather in Paris?")]})
    state = agent.invoke({"messages": [*state["messages"], ("user", "And in Rome?")]})
    kinds = [m.type for m in state["messages"]]
    assert kinds == ["human", "ai", "tool", "ai"] * 2
    report = finish_session(framework_proxy, "lg-loop")
    assert report.boundaries == [] and len(report.steps) == 4
    assert report.trained_tokens == _output_tokens(state["messages"])


def test_streamed_messages_are_recorded_as_sent(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "lg-stream", seed=2, streaming=True)
    question = {"messages": [("user", "Weather in Rome?")]}
    chunks = list(agent.stream(question, stream_mode="messages"))
    assert len(chunks) > 2
    ai = [c for c, _ in chunks if c.type == "AIMessageChunk"]
    usage = sum((c.usage_metadata or {}).get("output_tokens", 0) for c in ai)
    report = finish_session(framework_proxy, "lg-stream")
    assert report.boundaries == [] and len(report.steps) == 2
    assert report.trained_tokens == usage


def test_response_format_is_a_call_without_tools(framework_proxy: Proxy) -> None:
    agent = _agent(framework_proxy, "lg-structured", seed=3, response_format=Forecast)
    state = agent.invoke({"messages": [("user", "Weather in Paris?")]})
    assert isinstance(state["structured_response"], Forecast)
    report = finish_session(framework_proxy, "lg-structured")
    assert report.boundaries == ["tools_changed"] and len(report.segments) == 2
    assert [s.segment_index for s in report.steps] == [0, 0, 1]
