"""smolagents (Hugging Face) through the proxy: ``ToolCallingAgent`` and, for structured output,
``CodeAgent(use_structured_outputs_internally=True)``, both over ``OpenAIServerModel``.

smolagents rebuilds its messages from its memory on every step and never sends a tool call back
as ``tool_calls``: the call becomes assistant text (``"Calling tools:\n[...]"``), its result a user
message (``"Observation: ..."``). So every call after a tool call starts a new segment
(``assistant_mismatch``). When it runs out of steps it asks for a final answer with another
system prompt and no tools (``system_changed``). With thinking on, it keeps an answer's content
and drops its ``reasoning_content``; an echoed turn without its reasoning still extends the
segment, so reasoning-only turns split nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.proxy.frameworks.conftest import (
    MAX_TOKENS,
    THINKING_OFF,
    City,
    Proxy,
    finish_session,
    get_weather,
)

pytestmark = pytest.mark.integration


def _strict(tools: list[Any]) -> list[dict[str, Any]]:
    """smolagents' own tool schemas, marked strict (it sends none), so that the proxy holds the
    arguments to their schema; passed as the model's ``tools`` keyword, which overrides the
    schemas it would send."""
    from smolagents.models import get_tool_json_schema

    schemas = [get_tool_json_schema(t) for t in tools]
    for schema in schemas:
        schema["function"]["strict"] = True
        schema["function"]["parameters"]["additionalProperties"] = False
    return schemas


def _model(
    proxy: Proxy,
    session: str,
    tools: list[Any] | None,
    *,
    seed: int,
    max_tokens: int = MAX_TOKENS,
    thinking: bool = False,
) -> Any:
    """``OpenAIServerModel`` on the session; with ``tools``, their strict schemas and one call
    per answer (else free text may follow a call, to the token budget)."""
    from smolagents import OpenAIServerModel

    template = {"chat_template_kwargs": {"enable_thinking": True}} if thinking else THINKING_OFF
    calls = {"tools": _strict(tools), "parallel_tool_calls": False} if tools else {}
    return OpenAIServerModel(
        model_id="tiny", api_base=proxy.base_url(session), api_key="x",
        client_kwargs={"max_retries": 0}, max_tokens=max_tokens,
        extra_body={**template, "seed": seed}, **calls,
    )  # fmt: skip


def _final_answer_tool() -> Any:
    from smolagents import tool

    @tool
    def final_answer(answer: City) -> str:
        """Provides a final answer to the given problem.

        Args:
            answer: the city whose weather was asked for.
        """
        return answer

    return final_answer


def _weather_tool() -> Any:
    from smolagents import tool

    @tool
    def weather(city: City) -> str:
        """The weather in a city.

        Args:
            city: the city, Paris or Rome.
        """
        return get_weather(city)

    return weather


def test_tool_loop_splits_at_every_echoed_call(framework_proxy: Proxy) -> None:
    from smolagents import ToolCallingAgent

    tools = [_weather_tool(), _final_answer_tool()]
    model = _model(framework_proxy, "smol-loop", tools, seed=1)
    agent = ToolCallingAgent(tools=tools, model=model, max_steps=4)
    agent.run("Weather in Paris?")
    agent.run("And in Rome?", reset=False)
    report = finish_session(framework_proxy, "smol-loop")
    assert [s.finish_reason for s in report.steps] == ["tool_calls", "tool_calls"]
    assert report.boundaries == ["assistant_mismatch"]  # the first call, echoed as text
    echoed = [m for m in agent.write_memory_to_messages() if m.role == "tool-call"]
    assert echoed and all("Calling tools:" in m.content[0]["text"] for m in echoed)
    assert len(report.segments) == 2


def test_structured_code_agent(framework_proxy: Proxy) -> None:
    """``response_format`` (smolagents' ``{thought, code}`` schema) on every step."""
    from smolagents import CodeAgent

    tools = [_weather_tool()]
    agent = CodeAgent(
        tools=tools, model=_model(framework_proxy, "smol-structured", None, seed=2),
        max_steps=2, use_structured_outputs_internally=True,
    )  # fmt: skip
    agent.run("Weather in Paris?")
    report = finish_session(framework_proxy, "smol-structured")
    assert len(report.steps) == 3  # two steps, then the final answer asked without tools
    assert report.boundaries == ["assistant_mismatch", "system_changed"]


def test_thinking_drops_reasoning_only_turns_without_a_split(framework_proxy: Proxy) -> None:
    """Thinking on, 24 tokens: every answer is cut inside its reasoning block, so the proxy
    answers reasoning only; smolagents keeps the empty content and drops the reasoning."""
    from smolagents import ToolCallingAgent

    tools = [_weather_tool(), _final_answer_tool()]
    model = _model(framework_proxy, "smol-think", tools, seed=3, max_tokens=24, thinking=True)
    agent = ToolCallingAgent(tools=tools, model=model, max_steps=2)
    agent.run("Weather in Paris?")
    report = finish_session(framework_proxy, "smol-think")
    assert [s.finish_reason for s in report.steps] == ["length"] * 3
    sent_back = [m for m in agent.write_memory_to_messages() if m.role == "assistant"]
    assert [m.content[0]["text"] for m in sent_back] == ["", ""]  # no reasoning
    assert report.steps[1].boundary_reason is None  # the echo without reasoning extends
    assert report.boundaries == ["system_changed"]  # only the out-of-steps final answer
