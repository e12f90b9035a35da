"""The chat routes are served before Starlette's stack (issue 31): a chat call skips the
framework's middleware and router, gets the same answers and errors, and passes the same
per-request middleware (the refusal throttle, the access log); any other request, and any other
method on a chat path, goes through the app as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.config.proxy import ProxyConfig
from dressage.proxy.chat_routes import chat_route_session
from dressage.proxy.server import create_app
from dressage.proxy.testing import ScriptedEngine, serve_app
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script

ANSWER = "ok\n</think>\n\nFine.<|im_end|>"
KEY = "chat-key-0123"
BODY = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@pytest.mark.unit
def test_the_chat_paths_are_the_routers() -> None:
    assert chat_route_session("/v1/chat/completions") == ""
    assert chat_route_session("/sessions/s-1/v1/chat/completions") == "s-1"
    for other in (
        "/sessions//v1/chat/completions",
        "/sessions/a/b/v1/chat/completions",
        "/v1/chat/completions/",
        "/sessions/s-1/v1/chat/completions/",
        "/v1/completions",
        "/v1/models",
    ):
        assert chat_route_session(other) is None, other


@pytest.mark.integration
def test_a_chat_call_skips_the_framework_and_everything_else_takes_it(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    engine = ScriptedEngine(script(ANSWER))
    reached: list[tuple[str, str]] = []
    with engine.running() as engine_url:
        config = ProxyConfig(
            engine_url=engine_url, store_dir=tmp_path, api_key=KEY, client_refusal_rate=10.0
        )
        app = create_app(config, tito=qwen35_tito)
        stack = app.build_middleware_stack()

        async def spy(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                reached.append((scope["method"], scope["path"]))
            await stack(scope, receive, send)

        app.middleware_stack = spy  # type: ignore[assignment]
        key = {"Authorization": f"Bearer {KEY}"}
        with serve_app(app) as url:
            by_path = httpx.post(f"{url}/sessions/s-1/v1/chat/completions", json=BODY, headers=key)
            by_header = httpx.post(
                f"{url}/v1/chat/completions", json=BODY, headers={**key, "X-Session-Id": "s-2"}
            )
            no_key = httpx.post(f"{url}/sessions/s-3/v1/chat/completions", json=BODY)
            bad = httpx.post(
                f"{url}/sessions/s-4/v1/chat/completions", json={**BODY, "top_p": 5}, headers=key
            )
            no_session = httpx.post(f"{url}/v1/chat/completions", json=BODY, headers=key)
            wrong_method = httpx.get(f"{url}/v1/chat/completions", headers=key)
            health = httpx.get(f"{url}/health")
    assert by_path.status_code == by_header.status_code == 200
    assert by_path.json()["choices"][0]["message"]["content"] == "Fine."
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"
    assert no_session.status_code == 400
    assert no_session.json()["error"]["code"] == "missing_session"
    assert wrong_method.status_code == 405 and health.status_code == 200
    assert [r for r in reached if r[0] == "POST"] == [], "a chat call went through the stack"
    assert reached[-2:] == [("GET", "/v1/chat/completions"), ("GET", "/health")]
