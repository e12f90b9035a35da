"""The proxy's tokenizer against the engine's vocabulary: a proxy started without
``--tokenizer-path`` (the Qwen3.5 tokenizer) in front of a real embedded engine serving the
704-token task vocabulary refuses, naming both, whether the engine is up at start or comes up
later; the matching tokenizer is accepted; the rule holds for the real pairs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from openai import InternalServerError, OpenAI

from dressage.config.proxy import ProxyConfig
from dressage.proxy.server import READY_PREFIX
from dressage.proxy.testing import serve_proxy
from dressage.proxy.vocabulary import EngineVocabulary, engine_vocabulary, mismatch
from tests.helpers import ENGINE_KEY


def _engine(rows: int | None, path: str = "/models/m") -> EngineVocabulary:
    return EngineVocabulary(rows, path, path, "test")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ids", "rows", "refused"),
    [
        (248077, 248320, False),  # Qwen3.5: padded to a multiple of 128
        (248077, 248128, False),  # the tiny Qwen3.5 models
        (151669, 151936, False),  # Qwen3
        (128815, 129280, False),  # DeepSeek-V3
        (690, 704, False),  # the tiny task vocabulary
        (248077, 704, True),  # the issue: Qwen3.5 ids into a 704-row engine
        (690, 248320, True),  # the engine would sample ids the tokenizer cannot read
        (151669, 248320, True),  # Qwen3's tokenizer before a Qwen3.5 engine
        (248077, None, False),  # the engine does not say: not refused
    ],
)
def test_the_rule_on_real_pairs(ids: int, rows: int | None, refused: bool) -> None:
    sentence = mismatch(ids, _engine(rows), tokenizer_name="T", url="http://e")
    assert (sentence is not None) == refused
    if sentence:
        assert f"{ids} token ids" in sentence and f"vocabulary of {rows} rows" in sentence
        assert "--tokenizer-path /models/m" in sentence


@pytest.mark.unit
def test_the_engine_vocabulary_from_its_answers(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 248320}}))
    sglang = engine_vocabulary({"model_path": str(tmp_path)}, {"context_length": 4096})
    assert sglang.size == 248320 and sglang.tokenizer_path == str(tmp_path)
    embedded = engine_vocabulary({"model_path": "/nowhere"}, {"vocab_size": 704})
    assert embedded.size == 704 and embedded.source == "/server_info"
    unknown = engine_vocabulary({"model_path": "Qwen/Qwen3.5-4B"}, {})
    assert unknown.size is None and "neither" in unknown.source


@pytest.fixture(scope="module")
def task_model() -> Path:
    """A tiny random model of the 704-row task vocabulary (seconds to build, then cached)."""
    from dressage.tiny.model import TinyModelSpec, tiny_model_dir

    return tiny_model_dir(TinyModelSpec(vocab="qwen3.5-tasks"))


def _engine_app(model: Path, port: int = 0) -> object:
    from dressage.engine.config import EngineConfig
    from dressage.engine.server import create_app

    config = EngineConfig(
        model_path=str(model), host="127.0.0.1", port=port, device="cpu", num_threads=1,
        context_length=2048, admin_api_key=ENGINE_KEY,
    )  # fmt: skip
    return create_app(config)


@contextmanager
def _engine_on(sock: socket.socket, model: Path) -> Iterator[str]:
    """The embedded engine on a socket bound before (so a proxy can be told its URL first)."""
    import uvicorn

    from dressage.health import wait_healthy

    server = uvicorn.Server(uvicorn.Config(_engine_app(model), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        wait_healthy(url, 120, name="the engine")
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def _proxy_process(engine_url: str, store: Path, *flags: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "dressage.proxy.server", "--engine-url", engine_url]
    argv += ["--port", "0", "--store-dir", str(store), "--engine-retries", "0", *flags]
    env = {**os.environ, "DRESSAGE_ENGINE_ADMIN_KEY": ENGINE_KEY}
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, env=env)


def _refusal(stderr: str, model: Path) -> None:
    lines = [line for line in stderr.splitlines() if line.startswith("dressage-proxy: ")]
    assert len(lines) == 1, stderr[-2000:]
    assert "the project's qwen3.5 tokenizer" in lines[0] and "248077 token ids" in lines[0]
    assert f"serves {model} with a vocabulary of 704 rows" in lines[0]
    assert f"--tokenizer-path {model}" in lines[0]


@pytest.mark.integration
def test_a_proxy_refuses_to_start_before_an_engine_of_another_vocabulary(
    task_model: Path, tmp_path: Path
) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    with _engine_on(sock, task_model) as engine_url:
        proxy = _proxy_process(engine_url, tmp_path / "store")
        out, err = proxy.communicate(timeout=120)
    assert proxy.returncode == 2, err[-2000:]
    assert READY_PREFIX not in out  # it never said it was ready
    _refusal(err, task_model)


@pytest.mark.integration
def test_a_proxy_started_first_stops_once_the_engine_answers(
    task_model: Path, tmp_path: Path
) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: the engine is "not up yet"
    engine_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proxy = _proxy_process(engine_url, tmp_path / "store")
    try:
        assert proxy.stdout is not None
        ready = proxy.stdout.readline()
        assert ready.startswith(READY_PREFIX), ready  # it started: nothing to check against yet
        with _engine_on(sock, task_model):
            _, err = proxy.communicate(timeout=60)
    finally:
        proxy.kill()
    assert proxy.returncode == 2, err[-2000:]
    _refusal(err, task_model)


@pytest.mark.integration
def test_in_process_calls_are_refused_and_the_matching_tokenizer_serves(
    task_model: Path, tmp_path: Path
) -> None:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        task_model, device="cpu", num_threads=1, context_length=2048, admin_api_key=ENGINE_KEY
    ) as engine_url:
        wrong = ProxyConfig(engine_url=engine_url, store_dir=tmp_path / "a", engine_retries=0)
        with serve_proxy(wrong) as url:
            client = OpenAI(base_url=f"{url}/sessions/s/v1", api_key="x", max_retries=0)
            with pytest.raises(InternalServerError) as refused:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            assert refused.value.status_code == 503
            assert "vocabulary of 704 rows" in refused.value.message
            ready = httpx.get(f"{url}/ready")
            assert ready.status_code == 503 and "704 rows" in ready.json()["engine"]
        right = wrong.model_copy(
            update={"tokenizer_path": str(task_model), "store_dir": tmp_path / "b"}
        )
        with serve_proxy(right) as url:
            client = OpenAI(base_url=f"{url}/sessions/s/v1", api_key="x", max_retries=0)
            answer = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )  # fmt: skip
            assert answer.usage is not None and answer.usage.completion_tokens >= 1
            assert httpx.get(f"{url}/ready").status_code == 200
