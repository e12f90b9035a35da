"""The built-in agents through the real OpenAI SDK and the real proxy, a scripted engine behind.

The engine is scripted because the tiny models of the embedded default rarely write a valid
tool call; the proxy, its TITO tokenizer, its tool-call parser and its segment boundaries are
the real ones, so what is checked is what a rollout would record.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from dressage.agents import AgentResult, AgentTask, load_agent
from dressage.agents.compacting import compact
from dressage.config.proxy import DEFAULT_MAX_TOKENS
from dressage.proxy.tito import TITOTokenizer
from dressage.trajectory import Segment
from tests.agents.conftest import answer, tool_call
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

CALC = AgentTask(prompt="Compute 2 + 3. Reply with the number only.", task="calculator")


def _run(agent: str, url: str, session: str, task: AgentTask) -> AgentResult:
    async def go() -> AgentResult:
        client = AsyncOpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0)
        try:
            return await load_agent(agent)(client, task)
        finally:
            await client.close()

    return asyncio.run(go())


def _finalize(url: str, session: str) -> list[Segment]:
    response = httpx.post(f"{url}/v1/sessions/{session}/finalize")
    response.raise_for_status()
    return [Segment.from_dict(s) for s in response.json()["segments"]]


def test_tool_user_calls_the_calculator_and_answers_in_one_segment(
    tmp_path: Path, tito: TITOTokenizer
) -> None:
    plan = Script(tito, tool_call("calculator", expression="2 + 3"), answer("5"))
    with scripted_proxy(plan, tmp_path, tito) as (url, _):
        result = _run("tool_user", url, "calc", CALC)
        (segment,) = _finalize(url, "calc")
    assert result == AgentResult(final_answer="5", turns=2, tool_calls=1, stop_reason="answer")
    roles = [m["role"] for m in segment.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert segment.messages[3]["content"] == "5"  # the calculator's result went back
    assert json.loads(segment.messages[2]["tool_calls"][0]["function"]["arguments"]) == {
        "expression": "2 + 3"
    }
    # the task's tools were sent, and its sampling fields reached the engine
    assert '"name": "calculator"' in tito.decode(plan.bodies[0]["input_ids"])
    # the agent sets no max_tokens: the proxy's bounded default, within what the context leaves
    budgets = [body["sampling_params"]["max_new_tokens"] for body in plan.bodies]
    assert all(isinstance(b, int) and 0 < b <= DEFAULT_MAX_TOKENS for b in budgets), budgets


def test_bad_tool_arguments_come_back_as_an_error_result(
    tmp_path: Path, tito: TITOTokenizer
) -> None:
    plan = Script(
        tito,
        tool_call("calculator", expression="2 +"),
        tool_call("nope", x="1"),
        answer("I could not compute it."),
    )
    task = AgentTask(prompt=CALC.prompt, task="calculator", sampling={"max_tokens": 64})
    with scripted_proxy(plan, tmp_path, tito) as (url, _):
        result = _run("tool_user", url, "bad", task)
        (segment,) = _finalize(url, "bad")
    assert (result.turns, result.tool_calls, result.tool_errors) == (3, 2, 2)
    tools = [m["content"] for m in segment.messages if m["role"] == "tool"]
    assert tools[0].startswith("error: cannot parse '2 +'")
    assert tools[1].startswith("error: unknown tool 'nope'")
    assert result.final_answer == "I could not compute it."
    assert {body["sampling_params"]["max_new_tokens"] for body in plan.bodies} == {64}


def test_tool_user_stops_after_max_turns(tmp_path: Path, tito: TITOTokenizer) -> None:
    plan = Script(tito, tool_call("calculator", expression="1 + 1"))  # calls forever
    task = AgentTask(prompt=CALC.prompt, task="calculator", max_turns=3)
    with scripted_proxy(plan, tmp_path, tito) as (url, _):
        result = _run("tool_user", url, "loop", task)
    assert (result.turns, result.tool_calls, result.stop_reason) == (3, 3, "max_turns")
    assert len(plan.bodies) == 3


def test_compacting_agent_rewrites_its_history_into_new_segments(
    tmp_path: Path, tito: TITOTokenizer
) -> None:
    steps = [tool_call("calculator", expression=f"{k} * 2") for k in range(4)]
    plan = Script(tito, *steps, answer("6"))
    task = AgentTask(prompt=CALC.prompt, task="calculator", max_turns=6, compact_after=2)
    with scripted_proxy(plan, tmp_path, tito) as (url, _):
        result = _run("compacting", url, "compact", task)
        segments = _finalize(url, "compact")
        steps_recorded = httpx.get(f"{url}/v1/sessions/compact/trajectory").json()["steps"]
    assert (result.turns, result.compactions, result.final_answer) == (5, 2, "6")
    assert len(segments) == 3  # turns 1-2, 3-4, 5
    assert [s["segment_index"] for s in steps_recorded] == [0, 0, 1, 1, 2]
    assert all(s["boundary_reason"] for s in steps_recorded if s["step_index"] in (2, 4))
    summary = segments[1].messages[2]["content"]
    assert 'calculator({"expression": "1 * 2"}) -> 2' in summary
    assert segments[1].messages[:2] == segments[0].messages[:2]  # the request is kept


def test_compact_keeps_the_request_and_the_latest_notes() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    notes = [f"n{i}" for i in range(12)]
    out = compact(CALC, messages, notes)
    assert out[:2] == messages[:2] and out[2]["role"] == "user"
    assert "- n11" in out[2]["content"] and "- n3" not in out[2]["content"]


def test_agent_runs_as_a_command_against_openai_base_url(
    tmp_path: Path, tito: TITOTokenizer
) -> None:
    plan = Script(tito, tool_call("calculator", expression="2 + 3"), answer("5"))
    with scripted_proxy(plan, tmp_path, tito) as (url, _):
        env = dict(os.environ, OPENAI_BASE_URL=f"{url}/sessions/cli/v1", OPENAI_API_KEY="k")
        done = subprocess.run(
            [sys.executable, "-m", "dressage.agents", "tool_user"],
            input=CALC.to_json(),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        (segment,) = _finalize(url, "cli")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["final_answer"] == "5" and result["tool_calls"] == 1
    assert segment.messages[3] == {"role": "tool", "tool_call_id": segment.messages[2][
        "tool_calls"][0]["id"], "content": "5"}  # fmt: skip


def test_command_fails_with_a_message_without_a_base_url() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "dressage.agents", "tool_user", "--prompt", "hi"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and "OPENAI_BASE_URL is not set" in done.stderr


def test_unknown_agents_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="neither a built-in agent"):
        load_agent("no such agent")
    with pytest.raises(ValueError, match="cannot import dressage.agents.missing.run"):
        load_agent("dressage.agents.missing.run")
    with pytest.raises(ValueError, match="must be an async function"):
        load_agent("dressage.agents.tools.calculate")
