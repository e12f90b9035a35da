"""tool_choice, response_format, parallel_tool_calls and strict tools enforced end to end: the
OpenAI SDK -> the proxy -> the embedded engine's xgrammar masks (a random tiny model, so only
the constraint can make its output well-formed); the recorded segment stays token-exact; bad
constraints are 400s before any generation (a scripted engine that records every call)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import BadRequestError, OpenAI

from dressage.proxy.client import SyncProxyClient
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, running_proxy, scripted_proxy

pytestmark = pytest.mark.integration

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}


@pytest.fixture(scope="module")
def proxy(
    engine_url: str, tmp_path_factory: pytest.TempPathFactory, qwen35_tito: Any
) -> Iterator[str]:
    store = tmp_path_factory.mktemp("constraints")
    with running_proxy(engine_url, store, qwen35_tito) as url:
        yield url


def _client(url: str, session: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0)


def _call(url: str, session: str, **options: Any) -> Any:
    options.setdefault("max_tokens", 200)
    extra = {**NO_THINK, **options.pop("extra_body", {})}
    return _client(url, session).chat.completions.create(
        model="tiny", messages=options.pop("messages", USER), extra_body=extra, **options
    )


def _recorded(url: str, session: str, response: Any) -> None:
    """The step holds exactly the completion's tokens, each with the log-prob returned."""
    (step,) = SyncProxyClient(url).read_trajectory(session).steps
    assert len(step.output_ids) == response.usage.completion_tokens
    returned = [e.logprob for e in response.choices[0].logprobs.content]
    assert step.output_logprobs == pytest.approx(returned)


@pytest.mark.parametrize("seed", [1, 2])
def test_required_forces_a_schema_valid_call(proxy: str, seed: int) -> None:
    session = f"required-{seed}"
    response = _call(
        proxy,
        session,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,  # else free text may follow the call, to the token budget
        logprobs=True,
        seed=seed,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0].function
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert args["city"] in ("Paris", "Rome")
    else:
        assert call.name == "get_time" and isinstance(args, dict)
    _recorded(proxy, session, response)


def test_a_named_function_and_one_call_only(proxy: str) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    response = _call(
        proxy, "named", tools=[WEATHER, CLOCK], tool_choice=named, parallel_tool_calls=False,
        logprobs=True,
    )  # fmt: skip
    calls = response.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")
    _recorded(proxy, "named", response)


def test_allowed_tools_limit_the_calls(proxy: str) -> None:
    allowed = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        },
    }
    response = _call(
        proxy, "allowed", tools=[WEATHER, CLOCK], tool_choice=allowed, parallel_tool_calls=False
    )
    names = {c.function.name for c in response.choices[0].message.tool_calls}
    assert names == {"get_weather"}


def test_none_writes_no_call(proxy: str) -> None:
    for seed in range(3):
        response = _call(
            proxy, f"none-{seed}", tools=[WEATHER], tool_choice="none", seed=seed, max_tokens=30
        )
        message = response.choices[0].message
        assert not message.tool_calls and response.choices[0].finish_reason != "tool_calls"
        assert "<tool_call>" not in (message.content or "")


@pytest.mark.parametrize("strict", [True, False])
def test_response_format_json_schema(proxy: str, strict: bool) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "n": {"type": "integer"},
        },
        "required": ["answer", "n"],
        "additionalProperties": False,
    }
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": schema, "strict": strict},
    }
    response = _call(proxy, f"json-{strict}", response_format=response_format, logprobs=True)
    data = json.loads(response.choices[0].message.content)
    assert data["answer"] in ("yes", "no") and isinstance(data["n"], int)
    _recorded(proxy, f"json-{strict}", response)


def test_json_object_and_streamed_logprobs(proxy: str) -> None:
    client = _client(proxy, "stream-json")
    stream = client.chat.completions.create(
        model="tiny", messages=USER, extra_body=NO_THINK, max_tokens=30, stream=True,  # type: ignore[arg-type]
        logprobs=True, top_logprobs=2, response_format={"type": "json_object"},
    )  # fmt: skip
    text, entries = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs is not None:
                entries += chunk.choices[0].logprobs.content
    (step,) = SyncProxyClient(proxy).read_trajectory("stream-json").steps
    assert [e.logprob for e in entries] == pytest.approx(step.output_logprobs)
    assert all(len(e.top_logprobs) == 2 for e in entries)
    assert all(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in entries)
    if step.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.fixture
def scripted(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> Iterator[tuple[str, Script]]:
    answers = script("ok\n</think>\n\nFine.<|im_end|>")
    with scripted_proxy(answers, tmp_path, qwen35_tito) as (url, _):
        yield url, answers


def test_bad_constraints_are_400s_before_any_generation(scripted: tuple[str, Script]) -> None:
    url, answers = scripted
    bad_schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "schema": {"type": "object", "properties": {"a": {"type": "strng"}}},
        },
    }
    with pytest.raises(BadRequestError) as info:
        _call(url, "bad-schema", response_format=bad_schema)
    assert info.value.body["param"] == "response_format"  # type: ignore[index]
    assert "strng" in info.value.message
    named = {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(BadRequestError) as info:
        _call(url, "bad-name", tools=[WEATHER], tool_choice=named)
    assert "'get_time'" in info.value.message and "not in tools" in info.value.message
    bad_tool = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "nope"}}}
    with pytest.raises(BadRequestError) as info:
        _call(url, "bad-tool", tools=[bad_tool], tool_choice="required")
    assert "nope" in info.value.message
    assert answers.bodies == []  # the engine never saw any of them
    # and the constraint the engine gets for a good one is SGLang's structural_tag
    _call(url, "good", tools=[WEATHER], tool_choice="required")
    tag = json.loads(answers.bodies[-1]["sampling_params"]["structural_tag"])
    assert tag["type"] == "structural_tag"
    assert "get_weather" in json.dumps(tag)
