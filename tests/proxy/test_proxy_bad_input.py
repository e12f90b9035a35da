"""Bad input and failures: clear errors, and nothing already recorded is lost or bent.

Malformed messages, missing or bad session ids, a bad ``X-Dressage-Partial-Rollout`` header or
``open`` body, unknown / finalized / discarded sessions, an engine that is down (503 naming it;
the session carries on once it is back), an engine that refuses a request (its 4xx passes
through; the session is rolled back).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import BadRequestError, ConflictError, InternalServerError, OpenAI

from dressage.proxy.client import PARTIAL_ROLLOUT_HEADER
from dressage.proxy.testing import EngineReply, ScriptedEngine
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, running_proxy, scripted_proxy

pytestmark = pytest.mark.integration

ANSWER = "ok\n</think>\n\nFine.<|im_end|>"
USER = {"role": "user", "content": "hello"}


def _client(url: str, session: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0)


def _chat(client: OpenAI, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(model="m", messages=messages, max_tokens=16)  # type: ignore[arg-type]


@pytest.fixture
def proxy(tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]) -> Any:
    with scripted_proxy(script(ANSWER), tmp_path, qwen35_tito) as (url, _):
        yield url


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([{"role": "wizard", "content": "x"}], "message 0: unknown role 'wizard'"),
        ([USER, {"role": "tool", "content": "r"}], "message 1 (tool): a tool result must follow"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "message 0 (user): content part"),
        ([{"role": "user", "content": 5}], "message 0 (user): content must be"),
        (
            [USER, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
            "tool_calls[0] is malformed",
        ),
    ],
)
def test_malformed_messages_are_400_naming_the_message(
    proxy: str, messages: list[dict[str, Any]], needle: str
) -> None:
    with pytest.raises(BadRequestError) as info:
        _chat(_client(proxy, "bad"), messages)
    assert needle in info.value.message
    assert "session bad" in info.value.message
    assert httpx.get(f"{proxy}/v1/sessions/bad/stats").json()["steps"] == 0


def test_requests_without_a_usable_session(proxy: str) -> None:
    body = {"model": "m", "messages": [USER]}
    missing = httpx.post(f"{proxy}/v1/chat/completions", json=body)
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "missing_session"
    assert "X-Session-Id" in missing.json()["error"]["message"]
    bad = httpx.post(f"{proxy}/sessions/a%20b/v1/chat/completions", json=body)
    assert bad.status_code == 400 and "[A-Za-z0-9._:-]" in bad.json()["error"]["message"]
    by_header = httpx.post(
        f"{proxy}/v1/chat/completions", json=body, headers={"X-Session-Id": "hdr"}
    )
    assert by_header.status_code == 200
    alias = httpx.post(
        f"{proxy}/v1/chat/completions", json=body, headers={"X-Dressage-Session-Id": "hdr2"}
    )
    assert alias.status_code == 200
    assert httpx.get(f"{proxy}/v1/sessions/hdr/stats").json()["steps"] == 1
    not_json = httpx.post(
        f"{proxy}/sessions/s/v1/chat/completions", content=b"{nope", headers={"X-A": "b"}
    )
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]


def test_a_bad_partial_rollout_header_or_open_body_is_a_400_naming_it(proxy: str) -> None:
    for value in ("yes", "2", ""):
        client = OpenAI(
            base_url=f"{proxy}/sessions/pr/v1",
            api_key="x",
            max_retries=0,
            default_headers={PARTIAL_ROLLOUT_HEADER: value},
        )
        with pytest.raises(BadRequestError) as info:
            _chat(client, [USER])
        assert f"header X-Dressage-Partial-Rollout must be 0 or 1, got {value!r}" in str(
            info.value.message
        )
        assert info.value.code == "invalid_header"
    assert httpx.get(f"{proxy}/v1/sessions/pr/trajectory").status_code == 404  # nothing ran
    for good in ("1", "0"):
        client = OpenAI(
            base_url=f"{proxy}/sessions/pr/v1",
            api_key="x",
            max_retries=0,
            default_headers={PARTIAL_ROLLOUT_HEADER: good},
        )
        _chat(client, [USER])
    bad = [
        ({"partial_rollout": "yes"}, "partial_rollout must be true or false, got 'yes'"),
        ({"partial_rollout": 1}, "partial_rollout must be true or false, got 1"),
        ({"partial": True}, "unknown fields ['partial']"),
        ([True], "the body must be a JSON object, got list"),
    ]
    for body, needle in bad:
        response = httpx.post(f"{proxy}/v1/sessions/op/open", json=body)
        assert response.status_code == 400 and needle in response.json()["error"]["message"]
    assert httpx.get(f"{proxy}/v1/sessions/op/trajectory").status_code == 404
    empty = httpx.post(f"{proxy}/v1/sessions/op/open")  # no body: the flag is off
    assert empty.json() == {"session_id": "op", "status": "open", "partial_rollout": False}
    assert httpx.post(f"{proxy}/v1/sessions/a%20b/open").status_code == 400
    httpx.post(f"{proxy}/v1/sessions/pr/finalize").raise_for_status()
    closed = httpx.post(f"{proxy}/v1/sessions/pr/open", json={"partial_rollout": True})
    assert closed.status_code == 409 and closed.json()["error"]["code"] == "session_closed"


def test_unknown_finalized_and_discarded_sessions(proxy: str) -> None:
    for action, method in (("finalize", "POST"), ("discard", "POST"), ("trajectory", "GET")):
        response = httpx.request(method, f"{proxy}/v1/sessions/ghost/{action}")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "session_not_found"
    done = _client(proxy, "done")
    _chat(done, [USER])
    first = httpx.post(f"{proxy}/v1/sessions/done/finalize").json()
    assert httpx.post(f"{proxy}/v1/sessions/done/finalize").json() == first  # idempotent
    with pytest.raises(ConflictError, match="session done is finalized"):
        _chat(done, [USER])
    assert httpx.post(f"{proxy}/v1/sessions/done/discard").status_code == 409

    dropped = _client(proxy, "dropped")
    _chat(dropped, [USER])
    discarded = httpx.post(f"{proxy}/v1/sessions/dropped/discard").json()
    assert discarded == {"session_id": "dropped", "discarded": True, "steps": 1}
    with pytest.raises(ConflictError, match="discarded"):
        _chat(dropped, [USER])
    assert httpx.post(f"{proxy}/v1/sessions/dropped/finalize").status_code == 409
    assert httpx.get(f"{proxy}/v1/sessions/dropped/trajectory").json()["status"] == "discarded"


def test_a_session_survives_the_engine_going_away_and_coming_back(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    plan = script(ANSWER)
    first_engine = ScriptedEngine(plan)
    with first_engine.running() as engine_url:
        port = int(engine_url.rsplit(":", 1)[1])
        proxy_ctx = running_proxy(engine_url, tmp_path, qwen35_tito, engine_retries=1)
        url = proxy_ctx.__enter__()
        client = _client(url, "s")
        messages: list[dict[str, Any]] = [USER]
        messages.append(_chat(client, messages).choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "and then?"})
    try:
        with pytest.raises(InternalServerError) as info:  # the engine is gone
            _chat(client, messages)
        assert info.value.status_code == 503
        assert "engine at <engine>: unreachable" in info.value.message
        assert engine_url not in info.value.message  # clients never see where the engine runs
        stats = httpx.get(f"{url}/v1/sessions/s/stats").json()
        assert stats["steps"] == 1 and stats["status"] == "open"
        with ScriptedEngine(plan).running(port=port):  # back on the same address
            _chat(client, messages)
        steps = httpx.get(f"{url}/v1/sessions/s/trajectory").json()["steps"]
    finally:
        proxy_ctx.__exit__(None, None, None)
    assert [(s["step_index"], s["segment_index"]) for s in steps] == [(0, 0), (1, 0)]
    assert steps[1]["boundary_reason"] is None
    assert steps[1]["prefix_length"] == len(steps[0]["prompt_delta_ids"]) + len(
        steps[0]["output_ids"]
    )


def test_an_engine_refusal_passes_through_and_rolls_the_session_back(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    too_long = EngineReply(
        [],
        http_status=400,
        error_body={"error": {"message": "The input (99999 tokens) is longer than the model's"}},
    )
    plan = script(ANSWER, too_long, ANSWER)
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, _):
        client = _client(url, "rb")
        messages: list[dict[str, Any]] = [USER]
        messages.append(_chat(client, messages).choices[0].message.model_dump(exclude_none=True))
        with pytest.raises(BadRequestError, match="is longer than the model's"):
            _chat(client, [*messages, {"role": "user", "content": "a very long question"}])
        # the agent shortens its question: the segment simply goes on (nothing half-recorded)
        _chat(client, [*messages, {"role": "user", "content": "short"}])
        steps = httpx.get(f"{url}/v1/sessions/rb/trajectory").json()["steps"]
    assert [s["segment_index"] for s in steps] == [0, 0]
    assert steps[1]["boundary_reason"] is None
    assert steps[1]["messages"][0] == {"role": "user", "content": "short"}
    sent = plan.bodies[-1]["input_ids"]
    assert sent[: steps[1]["prefix_length"]] == plan.bodies[0]["input_ids"] + steps[0]["output_ids"]
