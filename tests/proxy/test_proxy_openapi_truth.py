"""The published OpenAPI body is the server's truth: framework-style bodies (what the OpenAI
SDK's agent frameworks send) are accepted by both the document's schema and the server, and
bodies the server refuses are refused by the schema too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from dressage.proxy.openai_schema import ChatCompletionBody
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
        "strict": True,
    },
}
ECHO = {  # an assistant message as the SDK dumps it back, extra keys and all
    "role": "assistant",
    "content": "Fine.",
    "refusal": None,
    "annotations": [],
    "audio": None,
    "function_call": None,
    "tool_calls": None,
}
ACCEPTED = {
    "agents-sdk": {"messages": [{"role": "developer", "content": "be brief"}, *USER],
                   "tools": [TOOL], "parallel_tool_calls": False, "store": False,
                   "metadata": {"run": "1"}, "temperature": 0.2, "top_p": 0},
    "langchain": {"messages": USER, "stream": True, "stream_options": {"include_usage": True},
                  "n": 1, "logprobs": True, "top_logprobs": 2},
    "pydantic-ai": {"messages": USER, "tools": [TOOL], "tool_choice": "required",
                    "max_completion_tokens": 16, "user": "u", "prompt_cache_key": "k"},
    "structured": {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "Out", "strict": True, "schema": {"type": "object", "properties": {}}}}},
    "json-object": {"messages": USER, "response_format": {"type": "json_object"},
                    "reasoning_effort": "none", "logit_bias": {"13": -100}},
    "echoed-history": {"messages": [*USER, ECHO, {"role": "user", "content": "more"}],
                       "modalities": ["text"], "verbosity": "medium", "service_tier": "auto"},
}  # fmt: skip
REFUSED = {
    "unknown-field": {"messages": USER, "return_token_ids": True},
    "n-2": {"messages": USER, "n": 2},
    "audio": {"messages": USER, "audio": {"voice": "x", "format": "wav"}},
    "web-search": {"messages": USER, "web_search_options": {}},
    "verbosity": {"messages": USER, "verbosity": "low"},
    "bad-role": {"messages": [{"role": "wizard", "content": "x"}]},
    "image-part": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
}


@pytest.fixture
def proxy(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> Iterator[str]:
    with scripted_proxy(script("ok\n</think>\n\nFine.<|im_end|>"), tmp_path, qwen35_tito) as (
        url,
        _,
    ):
        yield url


def _send(url: str, name: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{url}/sessions/{name}/v1/chat/completions", json={"model": "m", **body}, timeout=60
    )


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_framework_bodies_pass_the_schema_and_the_server(proxy: str, name: str) -> None:
    ChatCompletionBody.model_validate(ACCEPTED[name])
    answer = _send(proxy, name, ACCEPTED[name])
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_bodies_fail_the_schema_and_the_server(proxy: str, name: str) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionBody.model_validate(REFUSED[name])
    answer = _send(proxy, name, REFUSED[name])
    assert answer.status_code == 400, answer.text


def test_the_served_document_is_the_model(proxy: str) -> None:
    document = httpx.get(f"{proxy}/openapi.json").json()
    body = document["components"]["schemas"]["ChatCompletionBody"]
    assert body["additionalProperties"] is False
    assert set(body["properties"]) == set(ChatCompletionBody.model_fields)
