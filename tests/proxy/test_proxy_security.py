"""Keys and limits: the API key on chat endpoints, the admin key on session and control
endpoints (both as ``Authorization: Bearer``), 413 for oversized bodies, /health open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import APIStatusError, AuthenticationError, OpenAI

from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

ADMIN, API = "admin-key-0123456789", "api-key-0123456789"
ANSWER = "x\n</think>\n\nok<|im_end|>"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, qwen35_tito: TITOTokenizer) -> Iterator[str]:
    with scripted_proxy(
        Script(qwen35_tito, ANSWER), tmp_path_factory.mktemp("store"), qwen35_tito,
        admin_key=ADMIN, api_key=API, max_request_bytes=4096,
    ) as (url, _):  # fmt: skip
        yield url


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_chat_needs_the_api_key_and_accepts_the_admin_key(proxy: str) -> None:
    messages: list[Any] = list(USER)
    for key in ("wrong-key-0000000", "-"):
        client = OpenAI(base_url=f"{proxy}/sessions/keys/v1", api_key=key, max_retries=0)
        with pytest.raises(AuthenticationError, match="Authorization: Bearer"):
            client.chat.completions.create(model="m", messages=messages)
    for key in (API, ADMIN):
        client = OpenAI(base_url=f"{proxy}/sessions/keys/v1", api_key=key, max_retries=0)
        response = client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        assert response.choices[0].message.content == "ok"
        messages.append(response.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "again"})
    assert OpenAI(base_url=f"{proxy}/v1", api_key=API).models.list().data[0].id == "dressage"
    assert httpx.get(f"{proxy}/v1/models").status_code == 401
    assert httpx.get(f"{proxy}/v1/capabilities").status_code == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/sessions/a1/finalize"),
        ("POST", "/v1/sessions/a2/discard"),
        ("GET", "/v1/sessions/a3/trajectory"),
        ("GET", "/v1/sessions/a4/stats"),
        ("GET", "/v1/stats"),
    ],
)
def test_session_and_control_endpoints_need_the_admin_key(
    proxy: str, method: str, path: str
) -> None:
    session = path.split("/")[3] if "/sessions/" in path else "a5"
    httpx.post(
        f"{proxy}/sessions/{session}/v1/chat/completions",
        json={"messages": USER, "max_tokens": 4},
        headers=_bearer(API),
    ).raise_for_status()
    for headers in ({}, _bearer(API), _bearer("admin-key-0123456780"), {"Authorization": ADMIN}):
        denied = httpx.request(method, f"{proxy}{path}", headers=headers)
        assert denied.status_code == 401, headers
        assert denied.json()["error"]["type"] == "authentication_error"
    allowed = httpx.request(method, f"{proxy}{path}", headers=_bearer(ADMIN))
    assert allowed.status_code == 200


def test_health_is_open(proxy: str) -> None:
    assert httpx.get(f"{proxy}/health").json() == {"status": "ok"}


def test_oversized_requests_are_413_and_record_nothing(proxy: str) -> None:
    client = OpenAI(base_url=f"{proxy}/sessions/big/v1", api_key=API, max_retries=0)
    huge = [{"role": "user", "content": "x" * 5000}]
    with pytest.raises(APIStatusError) as info:
        client.chat.completions.create(model="m", messages=huge)  # type: ignore[arg-type]
    assert info.value.status_code == 413
    assert "exceeds 4096 bytes" in info.value.message

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    streamed = httpx.post(
        f"{proxy}/sessions/big/v1/chat/completions", content=chunks(), headers=_bearer(API)
    )
    assert streamed.status_code == 413
    missing = httpx.get(f"{proxy}/v1/sessions/big/stats", headers=_bearer(ADMIN))
    assert missing.status_code == 404  # the session was never created
