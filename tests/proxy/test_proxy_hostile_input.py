"""Hostile input never makes a 500: each bad value is a JSON 4xx naming the field.

The cases an attacker's fuzzer found (issue 15): a ``role`` that is a list or an object, a lone
surrogate in content, JSON nested 100,000 deep, tool ``parameters`` that are not a schema
object, ``enable_thinking: "no"``, session ids ``.`` and ``..``, a 100,000-character session id
in the path (refused by the HTTP parser itself, in plain text), and errors that told agents
where the engine runs. Against a real uvicorn server, because the last ones happen there.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, running_proxy, scripted_proxy

pytestmark = pytest.mark.integration

ANSWER = "ok\n</think>\n\nFine.<|im_end|>"
USER = {"role": "user", "content": "hello"}


@pytest.fixture
def proxy(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> Iterator[str]:
    with scripted_proxy(script(ANSWER), tmp_path, qwen35_tito) as (url, _):
        yield url


def _raw(url: str, target: bytes, body: bytes, headers: bytes = b"") -> tuple[int, bytes, bytes]:
    """One HTTP/1.1 request written by hand (no client normalises the path or refuses a long
    URL); returns the status, the head and the body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST " + target + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n" % len(body) + headers + b"\r\n" + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, payload


def _error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    return error


def _steps(proxy: str, session: str) -> int:
    stats = httpx.get(f"{proxy}/v1/sessions/{session}/stats")
    return int(stats.json()["steps"]) if stats.status_code == 200 else 0


@pytest.mark.parametrize("role", [["user"], {"a": 1}, 7, None])
def test_a_role_that_is_not_a_string_is_a_400_naming_it(proxy: str, role: Any) -> None:
    body = {"messages": [USER, {"role": role, "content": "x"}]}
    response = httpx.post(f"{proxy}/sessions/r/v1/chat/completions", json=body)
    error = _error(response)
    assert error["param"] == "messages[1].role"
    assert "messages[1].role must be a string" in error["message"]
    assert _steps(proxy, "r") == 0


def test_a_lone_surrogate_is_a_400_naming_where_it_is(proxy: str) -> None:
    raw = b'{"messages": [{"role": "user", "content": "\\ud800x"}]}'
    response = httpx.post(
        f"{proxy}/sessions/s/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    error = _error(response)
    assert error["param"] == "messages[0].content"
    assert "lone UTF-16 surrogate" in error["message"]
    # an escaped surrogate pair is one character (an emoji), and fine
    pair = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    ok = httpx.post(
        f"{proxy}/sessions/s/v1/chat/completions",
        content=pair,
        headers={"content-type": "application/json"},
    )
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("depth", [100_000, 65])
def test_deeply_nested_json_is_a_400(proxy: str, depth: int) -> None:
    raw = b'{"messages": [' + b'{"role": "user", "content": "x", "x": ' + b"[" * depth
    raw += b"]" * depth + b"}]}"
    response = httpx.post(
        f"{proxy}/sessions/d/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    error = _error(response)
    assert "deeper than 64 levels" in error["message"]


def test_tool_call_arguments_nested_deep_are_a_400(proxy: str) -> None:
    arguments = "[" * 50_000 + "]" * 50_000
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [USER, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "r"}]
    response = httpx.post(f"{proxy}/sessions/t/v1/chat/completions", json={"messages": messages})
    assert "the arguments nests arrays and objects deeper" in _error(response)["message"]


@pytest.mark.parametrize("parameters", ["str", [1, 2]])
def test_tool_parameters_must_be_a_schema_object(proxy: str, parameters: Any) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    body = {"messages": [USER], "tools": [tool]}
    error = _error(httpx.post(f"{proxy}/sessions/p/v1/chat/completions", json=body))
    assert error["param"] == "tools[0].function.parameters"
    assert "must be a JSON Schema object" in error["message"]


@pytest.mark.parametrize("value", ["no", 0, "false"])
def test_enable_thinking_must_be_a_boolean(proxy: str, value: Any) -> None:
    body = {"messages": [USER], "chat_template_kwargs": {"enable_thinking": value}}
    error = _error(httpx.post(f"{proxy}/sessions/k/v1/chat/completions", json=body))
    assert error["param"] == "chat_template_kwargs.enable_thinking"


@pytest.mark.parametrize("session", [".", ".."])
def test_dot_session_ids_are_refused(proxy: str, session: str) -> None:
    body = json.dumps({"messages": [USER]}).encode()
    # by path (written by hand: clients normalise /./ and /../ away) and by header
    status, _, payload = _raw(proxy, b"/sessions/%s/v1/chat/completions" % session.encode(), body)
    assert status == 400 and json.loads(payload)["error"]["param"] == "session_id"
    by_header = httpx.post(
        f"{proxy}/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": session}
    )
    assert _error(by_header)["param"] == "session_id"
    assert httpx.get(f"{proxy}/v1/stats").json()["sessions"]["open"] == 0


def test_a_100k_character_session_id_is_a_json_400(proxy: str) -> None:
    body = json.dumps({"messages": [USER]}).encode()
    long_id = b"a" * 100_000
    status, head, payload = _raw(proxy, b"/sessions/" + long_id + b"/v1/chat/completions", body)
    assert status == 400 and b"content-type: application/json" in head
    error = json.loads(payload)["error"]
    assert error["code"] == "invalid_http_request"
    assert "the URL is 100030 bytes long, over the limit of 65535" in error["message"]
    # a long id that the parser lets through is refused by the proxy, naming the field
    status, _, payload = _raw(proxy, b"/sessions/" + b"a" * 1000 + b"/v1/chat/completions", body)
    assert status == 400 and json.loads(payload)["error"]["param"] == "session_id"


def test_errors_never_show_where_the_engine_runs_and_ready_says_what_is_down(
    tmp_path: Path, qwen35_tito: TITOTokenizer
) -> None:
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    with running_proxy(dead, tmp_path, qwen35_tito, engine_retries=0) as url:
        assert httpx.get(f"{url}/health").status_code == 200  # the proxy itself is alive
        ready = httpx.get(f"{url}/ready")
        assert ready.status_code == 503
        assert ready.json() == {"status": "not_ready", "engine": "unreachable or unhealthy"}
        failed = httpx.post(f"{url}/sessions/e/v1/chat/completions", json={"messages": [USER]})
        error = _error(failed, 503)
        assert error["code"] == "engine_unavailable"
        assert "<engine>" in error["message"] and "127.0.0.1" not in error["message"]


def test_ready_is_200_when_the_engine_answers(proxy: str) -> None:
    ready = httpx.get(f"{proxy}/ready")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "engine": "ok"}
