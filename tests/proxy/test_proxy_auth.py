"""Who may call what on the proxy, and the keys it passes to its engine (issue 15, items 2, 3).

Every admin route x every way of sending a key (the header cases of tests/auth_cases.py, as for
the engine), the chat routes with the API key or the admin key, /health open; the engine's keys
on the wire (the API key on ``/generate``, the control key on pause and continue), and through a
real engine; and the start-up refusals of ``dressage-proxy`` for key variables that are set but
empty, through its real entry point in this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.proxy.server import main as proxy_main
from dressage.proxy.testing import ScriptedEngine
from dressage.proxy.tito import TITOTokenizer
from tests.auth_cases import accepted, call, refused
from tests.helpers import ENGINE_KEY, bearer, report_auth
from tests.proxy.conftest import Script, running_proxy, scripted_proxy

ADMIN, API = "proxy-admin-key-0123", "proxy-api-key-0123"
ENGINE_API = "engine-api-key-0123"
ANSWER = "x\n</think>\n\nok<|im_end|>"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}

ADMIN_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/sessions/{s}/open", {"partial_rollout": True}),
    ("GET", "/v1/sessions/{s}/trajectory", None),
    ("GET", "/v1/sessions/{s}/stats", None),
    ("GET", "/v1/stats", None),
    ("POST", "/v1/rollout/pause", {"reason": "matrix", "timeout_seconds": 30}),
    ("GET", "/v1/rollout/pause_state", None),
    ("POST", "/v1/rollout/resume", {"reason": "matrix"}),
    ("POST", "/v1/sessions/{s}/finalize", None),
    ("POST", "/v1/sessions/{d}/discard", None),
]
"""(method, path, body), in an order in which each answers 200 once the key is right:
``{s}`` and ``{d}`` are sessions with one step each."""

CHAT_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/sessions/{s}/v1/chat/completions", CHAT),
    ("GET", "/v1/models", None),
    ("GET", "/sessions/{s}/v1/models", None),
    ("GET", "/v1/capabilities", None),
]


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, qwen35_tito: TITOTokenizer
) -> Iterator[tuple[str, ScriptedEngine]]:
    with scripted_proxy(
        Script(qwen35_tito, ANSWER), tmp_path_factory.mktemp("store"), qwen35_tito,
        admin_key=ADMIN, api_key=API, engine_api_key=ENGINE_API, engine_admin_key=ENGINE_KEY,
    ) as (url, engine):  # fmt: skip
        yield url, engine


def _chat(url: str, session: str) -> None:
    r = httpx.post(f"{url}/sessions/{session}/v1/chat/completions", json=CHAT, headers=bearer(API))
    assert r.status_code == 200, r.text


def _denied(got: tuple[int, Any]) -> bool:
    status, body = got
    return status == 401 and body["error"]["type"] == "authentication_error"


@pytest.mark.integration
def test_admin_routes_need_the_admin_key(proxy: tuple[str, ScriptedEngine]) -> None:
    url, engine = proxy
    _chat(url, "victim")
    wrong = []
    for name, header in refused(ADMIN, API).items():
        for method, path, body in ADMIN_ROUTES:
            got = call(url, method, path.format(s="victim", d="victim"), header, body)
            if not _denied(got):
                wrong.append((name, method, path, got))
    attempts = len(refused(ADMIN, API)) * len(ADMIN_ROUTES)
    report_auth("proxy admin routes", attempts, attempts - len(wrong))
    assert not wrong, f"answered without the admin key: {wrong}"
    seen = call(url, "GET", "/v1/sessions/victim/trajectory", f"Bearer {ADMIN}")[1]
    assert seen["status"] == "open" and len(seen["steps"]) == 1  # not finalized, not discarded
    assert call(url, "GET", "/v1/rollout/pause_state", f"Bearer {ADMIN}")[1]["paused"] is False
    assert not any(s.path == "/pause_generation" for s in engine.seen)
    for name, header in accepted(ADMIN).items():
        s, d = f"kept-{name}", f"dropped-{name}"
        _chat(url, s)
        _chat(url, d)
        for method, path, body in ADMIN_ROUTES:
            got = call(url, method, path.format(s=s, d=d), header, body)
            if got[0] != 200:
                wrong.append((name, method, path, got))
    assert not wrong, f"the admin key was refused or misanswered: {wrong}"


@pytest.mark.integration
def test_chat_routes_take_the_api_key_or_the_admin_key(proxy: tuple[str, ScriptedEngine]) -> None:
    url, _ = proxy
    wrong = []
    for name, header in refused(API, None).items():
        for method, path, body in CHAT_ROUTES:
            got = call(url, method, path.format(s="chat-refused"), header, body)
            if not _denied(got):
                wrong.append((name, path, got))
    attempts = len(refused(API, None)) * len(CHAT_ROUTES)
    report_auth("proxy chat routes", attempts, attempts - len(wrong))
    for key in (API, ADMIN):
        for name, header in accepted(key).items():
            for method, path, body in CHAT_ROUTES:
                if (got := call(url, method, path.format(s="chat-ok"), header, body))[0] != 200:
                    wrong.append((key, name, path, got))
    session_header = {"authorization": f"Bearer {API}", "x-session-id": "chat-by-header"}
    by_header = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=session_header)
    if by_header.status_code != 200:
        wrong.append(("by header", by_header.status_code))
    for header in (None, "Bearer wrong-key-0123456"):
        if (got := call(url, "GET", "/health", header))[0] != 200:
            wrong.append(("health", header, got))
    assert not wrong, wrong


@pytest.mark.integration
def test_the_engine_gets_its_keys(proxy: tuple[str, ScriptedEngine]) -> None:
    url, engine = proxy
    _chat(url, "keys-on-the-wire")
    admin = bearer(ADMIN)
    assert httpx.post(f"{url}/v1/rollout/pause", json={}, headers=admin).status_code == 200
    assert httpx.post(f"{url}/v1/rollout/resume", json={}, headers=admin).status_code == 200
    sent = {(s.path, s.headers.get("authorization")) for s in engine.seen}
    assert ("/generate", f"Bearer {ENGINE_API}") in sent
    control = {auth for path, auth in sent if path in ("/pause_generation", "/continue_generation")}
    assert control == {f"Bearer {ENGINE_KEY}"}  # the control key, never the API key


@pytest.mark.integration
def test_a_real_engine_pauses_only_for_a_proxy_with_its_key(
    tiny_model_path: Path, tmp_path: Path, qwen35_tito: TITOTokenizer
) -> None:
    from dressage.engine.testing import serve_engine

    admin = bearer(ADMIN)
    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=512, admin_api_key=ENGINE_KEY
    ) as engine_url:

        def engine_paused() -> bool:  # an abort-mode pause holds the gate closed
            return bool(httpx.get(f"{engine_url}/v1/loads").json()["loads"][0]["gate_closed"])

        with running_proxy(
            engine_url, tmp_path / "keyless", qwen35_tito, admin_key=ADMIN, engine_retries=0
        ) as url:
            refused_pause = httpx.post(f"{url}/v1/rollout/pause", json={}, headers=admin)
            assert refused_pause.status_code != 200 and not engine_paused()
        with running_proxy(
            engine_url, tmp_path / "keyed", qwen35_tito, admin_key=ADMIN, engine_retries=0,
            engine_admin_key=ENGINE_KEY,
        ) as url:  # fmt: skip
            paused = httpx.post(f"{url}/v1/rollout/pause", json={}, headers=admin)
            assert paused.status_code == 200, paused.text
            assert engine_paused()
            resumed = httpx.post(f"{url}/v1/rollout/resume", json={}, headers=admin)
            assert resumed.status_code == 200 and not engine_paused()


# ------------------------------------------------------------------------------ start-up
KEY_VARIABLES = [
    "DRESSAGE_PROXY_ADMIN_KEY",
    "DRESSAGE_PROXY_API_KEY",
    "DRESSAGE_PROXY_ENGINE_API_KEY",
    "DRESSAGE_ENGINE_ADMIN_KEY",
]


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def serve(argv: list[str], port: int, store: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    base = ["--engine-url", "http://127.0.0.1:9", "--store-dir", str(store), "--port", str(port)]
    return proxy_main([*base, *argv]), capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("variable", KEY_VARIABLES)
def test_a_key_variable_set_but_empty_stops_the_proxy(
    variable: str,
    busy_port: int,
    tmp_path: Path,
    no_keys: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``DRESSAGE_PROXY_ADMIN_KEY=`` (an unset ``$KEY`` in a shell) used to leave the admin
    routes open; every key variable now stops the proxy before it serves, naming itself."""
    no_keys.setenv(variable, "")
    code, err = serve([], busy_port, tmp_path / "store", capsys)
    assert code == 2 and f"{variable} is set but empty" in err, err
    assert not (tmp_path / "store").exists()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--admin-key", ""], "--admin-key is empty: an empty key is not 'no key'"),
        (["--engine-admin-key", " "], "--engine-admin-key is empty"),
        (["--api-key", "two words here"], "printable ASCII without spaces"),
        (["--host", "0.0.0.0"], "'0.0.0.0' is not a loopback address: set an admin key"),
    ],
)
def test_keys_that_cannot_work_stop_the_proxy(
    argv: list[str],
    expected: str,
    busy_port: int,
    tmp_path: Path,
    no_keys: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = serve(argv, busy_port, tmp_path / "store", capsys)
    assert code == 2 and expected in err, err
    assert "two words here" not in err  # a refused key is never printed


@pytest.mark.unit
def test_the_engine_key_comes_from_the_engines_own_variable(no_keys: pytest.MonkeyPatch) -> None:
    from dressage.config.proxy import config_from_argv

    no_keys.setenv("DRESSAGE_ENGINE_ADMIN_KEY", ENGINE_KEY)
    config, _ = config_from_argv(["--engine-url", "http://127.0.0.1:9"])
    assert config.engine_admin_key == ENGINE_KEY
    config, _ = config_from_argv(["--engine-admin-key", "flag-key-0123"])
    assert config.engine_admin_key == "flag-key-0123"
