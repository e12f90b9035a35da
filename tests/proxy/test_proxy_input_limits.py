"""Large inputs stall no one, impossible ones are refused untokenized, and a call without
``max_tokens`` gets a bounded budget (issue 15, items 4 and 6).

The engine's context comes from its ``/server_info`` (the scripted engine's ``context_length``).
A spy in front of TITO's encoder sees every text the proxy tokenizes; one variant blocks on a
large text until the test lets it go, so "``/health`` answers while a large input tokenizes" is
checked with events, not timings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.config.proxy import DEFAULT_MAX_TOKENS, ProxyConfig
from dressage.proxy.testing import ScriptedEngine, serve_proxy
from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer
from tests.proxy.conftest import Script

pytestmark = pytest.mark.integration

ANSWER = "ok\n</think>\n\nFine.<|im_end|>"


class SpyEncoder:
    """Records the length of every text encoded; texts over ``block_over`` characters wait for
    ``release`` (after setting ``started``)."""

    def __init__(self, encode: Callable[[str], list[int]], block_over: int | None = None) -> None:
        self.encode = encode
        self.block_over = block_over
        self.lengths: list[int] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, text: str) -> list[int]:
        self.lengths.append(len(text))
        if self.block_over is not None and len(text) > self.block_over:
            self.started.set()
            assert self.release.wait(60), "never released"
        return self.encode(text)


@contextmanager
def spied_proxy(
    tmp_path: Path,
    tokenizer: Any,
    plan: Script,
    *,
    context_length: int | None,
    block_over: int | None = None,
) -> Iterator[tuple[str, ScriptedEngine, SpyEncoder]]:
    tito = create_tito_tokenizer(tokenizer, "qwen3.5")  # its own: the spy goes in front of it
    engine = ScriptedEngine(plan, context_length=context_length)
    with engine.running() as engine_url:
        config = ProxyConfig(engine_url=engine_url, store_dir=tmp_path, engine_retries=0)
        with serve_proxy(config, tito=tito) as url:
            spy = SpyEncoder(tito.encode, block_over)  # after create_app installed its memo
            tito.encode = spy
            try:
                yield url, engine, spy
            finally:
                spy.release.set()


def _chat(url: str, session: str, content: str, **body: Any) -> httpx.Response:
    messages = [{"role": "user", "content": content}]
    return httpx.post(
        f"{url}/sessions/{session}/v1/chat/completions",
        json={"messages": messages, **body},
        timeout=60,
    )


def test_an_input_that_cannot_fit_is_refused_before_it_is_tokenized(
    tmp_path: Path, qwen35_tokenizer: Any, script: Callable[..., Script]
) -> None:
    with spied_proxy(tmp_path, qwen35_tokenizer, script(ANSWER), context_length=4096) as (
        url,
        engine,
        spy,
    ):
        huge = "x" * 1_000_000  # 1 MB: under the body limit, far over 4,095 tokens
        response = _chat(url, "huge", huge)
        assert max(spy.lengths, default=0) < 1000, "the message was never tokenized"
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert "1000000 characters" in error["message"] and "4095 tokens" in error["message"]
    assert not [s for s in engine.seen if s.path == "/generate"]


def test_a_prompt_too_long_once_tokenized_is_refused_before_the_engine(
    tmp_path: Path, qwen35_tokenizer: Any, script: Callable[..., Script]
) -> None:
    with spied_proxy(tmp_path, qwen35_tokenizer, script(ANSWER), context_length=64) as (
        url,
        engine,
        _,
    ):
        response = _chat(url, "long", "word " * 200)  # 1,000 characters, ~200 tokens
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "the engine takes at most 63" in error["message"]
    assert not [s for s in engine.seen if s.path == "/generate"]


def test_health_answers_while_a_large_input_tokenizes(
    tmp_path: Path, qwen35_tokenizer: Any, script: Callable[..., Script]
) -> None:
    large = "lorem ipsum dolor sit amet " * 10_000  # 270k characters: allowed, slow to tokenize
    with spied_proxy(
        tmp_path, qwen35_tokenizer, script(ANSWER), context_length=1 << 20, block_over=200_000
    ) as (url, _, spy):
        result: list[httpx.Response] = []
        call = threading.Thread(target=lambda: result.append(_chat(url, "big", large)))
        call.start()
        try:
            assert spy.started.wait(30), "the large input never reached the tokenizer"
            health = httpx.get(f"{url}/health", timeout=10)  # the encoder is still blocked
            other = _chat(url, "small", "hi")  # and another session is served too
        finally:
            spy.release.set()
            call.join(60)
    assert health.status_code == 200 and other.status_code == 200
    assert result and result[0].status_code == 200, result


@pytest.mark.parametrize(
    ("context_length", "budget"),
    [(None, DEFAULT_MAX_TOKENS), (1 << 20, DEFAULT_MAX_TOKENS), (1024, "rest")],
)
def test_a_call_without_max_tokens_gets_a_bounded_budget(
    tmp_path: Path,
    qwen35_tito: TITOTokenizer,
    script: Callable[..., Script],
    context_length: int | None,
    budget: int | str,
) -> None:
    plan = script(ANSWER)
    engine = ScriptedEngine(plan, context_length=context_length)
    with engine.running() as engine_url:
        config = ProxyConfig(engine_url=engine_url, store_dir=tmp_path, engine_retries=0)
        with serve_proxy(config, tito=qwen35_tito) as url:
            assert _chat(url, "budget", "hi").status_code == 200
            assert _chat(url, "asked", "hi", max_tokens=7).status_code == 200
    unset, asked = (body["sampling_params"]["max_new_tokens"] for body in plan.bodies)
    prompt = len(plan.bodies[0]["input_ids"])
    assert unset == (1024 - prompt if budget == "rest" else budget)
    assert asked == 7
