"""The request-field table: docs/openai-api.md shows exactly the code's table, and each row does
what it says through a proxy over a scripted engine (engine fields land where the table says,
ignored fields leave the engine body as it was, refused fields get a 400 naming them)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.proxy.request_fields import FIELDS, KNOWN_FIELDS
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-api.md"
HANDLING = {
    "honoured": "honoured",
    "passed to the engine": "engine",
    "refused": "refused",
    "ignored": "ignored",
}
ANSWER = "ok\n</think>\n\nFine.<|im_end|>"
BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
# every field of OpenAI's chat-completions request (its API reference, 2026)
OPENAI_FIELDS = {
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
    "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
    "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier",
    "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
    "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
}  # fmt: skip


def _doc_rows() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = re.match(r"^\| `([a-z_]+)` \| ([a-z ]+) \| (.+) \|$", line)
        if match and match[2] in HANDLING:
            assert match[1] not in rows, f"{match[1]} is in the docs twice"
            rows[match[1]] = f"{HANDLING[match[2]]}: {match[3]}"
    return rows


def test_the_docs_table_is_the_code_table() -> None:
    assert _doc_rows() == {f.name: f"{f.handling}: {f.how}" for f in FIELDS}
    assert {f.name for f in FIELDS if not f.sglang} == OPENAI_FIELDS


@pytest.fixture
def proxy(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> Iterator[tuple[str, Script]]:
    answers = script(ANSWER)
    with scripted_proxy(answers, tmp_path, qwen35_tito) as (url, _):
        yield url, answers


def _post(url: str, session: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/sessions/{session}/v1/chat/completions", json=body, timeout=60)


def _engine_body(answers: Script) -> dict[str, Any]:
    body = dict(answers.bodies[-1])
    body.pop("rid", None)
    return body


def _at(body: dict[str, Any], path: str) -> Any:
    value: Any = body
    for key in path.split("."):
        value = value[key]
    return value


@pytest.mark.parametrize("field", [f for f in FIELDS if f.handling != "honoured"], ids=str)
def test_each_row_does_what_the_table_says(proxy: tuple[str, Script], field: Any) -> None:
    url, answers = proxy
    assert _post(url, f"base-{field.name}", BASE).status_code == 200
    baseline = _engine_body(answers)
    body = {**BASE, field.name: field.probe}
    if field.name == "top_logprobs":
        body["logprobs"] = True
    if field.name == "max_completion_tokens":
        body.pop("max_tokens")
    answer = _post(url, f"probe-{field.name}", body)
    if field.handling == "refused":
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == field.name
        return
    assert answer.status_code == 200, answer.text
    sent = _engine_body(answers)
    if field.handling == "ignored":
        assert sent == baseline
        return
    expected = field.probe
    if field.name == "top_p" or field.name == "temperature":
        expected = pytest.approx(field.probe)
    if field.name == "logit_bias":
        expected = {k: float(v) for k, v in field.probe.items()}
    if field.name == "stop_token_ids":
        assert set(field.probe) <= set(_at(sent, field.engine))
        return
    assert _at(sent, field.engine) == expected


def test_a_field_in_neither_table_is_refused_naming_it(proxy: tuple[str, Script]) -> None:
    url, _ = proxy
    assert "return_token_ids" not in KNOWN_FIELDS
    answer = _post(url, "unknown", {**BASE, "return_token_ids": True})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "return_token_ids"
    assert "return_token_ids" in answer.json()["error"]["message"]


def test_top_p_zero_is_greedy_and_developer_is_system(proxy: tuple[str, Script]) -> None:
    url, answers = proxy
    dev = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert _post(url, "greedy", {**BASE, "messages": dev, "top_p": 0}).status_code == 200
    params = answers.bodies[-1]["sampling_params"]
    assert params["top_k"] == 1 and "top_p" not in params
    sys_ = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert _post(url, "sys", {**BASE, "messages": sys_}).status_code == 200
    assert answers.bodies[-1]["input_ids"] == answers.bodies[-2]["input_ids"]
