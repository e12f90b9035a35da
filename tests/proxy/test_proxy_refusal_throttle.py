"""The refusal budget per client address (issue 31, bad input: "a flood of tiny calls costs that
client"): refusals past the burst are held to the refill rate, successes are never held, other
addresses are untouched, and past ``MAX_HELD`` waiting requests the answer is an immediate 429.

The app behind the throttle is a two-route Starlette app; the clock and the sleep are the test's,
so the waits are read exactly instead of timed. The proxy's own wiring (a real proxy process, a
client on another loopback address) is in the last test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from dressage.config.proxy import ProxyConfig
from dressage.proxy.client_limits import MAX_HELD, RefusalThrottle
from dressage.proxy.testing import EngineReply, ScriptedEngine, serve_proxy
from dressage.proxy.tito import create_tito_tokenizer


async def _ok(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


async def _bad(request: Request) -> JSONResponse:
    return JSONResponse({"error": "no"}, status_code=400)


class _Clock:
    """Time that moves only when a held request sleeps; every sleep is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def _throttled(clock: _Clock, *, rate: float = 10.0, burst: int = 3, sleep: Any = None) -> Any:
    app = Starlette(routes=[Route("/ok", _ok), Route("/bad", _bad)])
    return RefusalThrottle(app, rate=rate, burst=burst, clock=clock, sleep=sleep or clock.sleep)


def _client(app: Any, host: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://proxy")


def test_refusals_past_the_burst_wait_for_the_refill_and_successes_never_do() -> None:
    clock = _Clock()
    app = _throttled(clock, rate=10.0, burst=3)

    async def scenario() -> None:
        async with _client(app, "10.0.0.1") as client:
            for _ in range(20):  # successes spend nothing
                assert (await client.get("/ok")).status_code == 200
            assert clock.sleeps == []
            for _ in range(3):  # the burst
                assert (await client.get("/bad")).status_code == 400
            assert clock.sleeps == []
            for _ in range(4):  # then one refusal per 1/rate, each answered as usual
                assert (await client.get("/bad")).status_code == 400
            assert clock.sleeps == [0.1, 0.1, 0.1, 0.1]
            clock.sleeps.clear()
            clock.now += 0.25  # 2.5 refusals' worth refilled
            for _ in range(2):
                assert (await client.get("/bad")).status_code == 400
            assert clock.sleeps == []
            assert (await client.get("/bad")).status_code == 400
            assert clock.sleeps == [0.05]
            clock.now += 10.0  # a client that mends its ways is served at once again
            assert (await client.get("/ok")).status_code == 200
            assert clock.sleeps == [0.05]

    asyncio.run(scenario())


def test_one_address_spending_its_budget_leaves_the_others_untouched() -> None:
    clock = _Clock()
    app = _throttled(clock, rate=10.0, burst=2)

    async def scenario() -> None:
        async with _client(app, "10.0.0.1") as hostile, _client(app, "10.0.0.2") as other:
            for _ in range(6):
                await hostile.get("/bad")
            held = len(clock.sleeps)
            assert held == 4
            assert (await other.get("/ok")).status_code == 200
            for _ in range(2):  # its own burst, whole
                assert (await other.get("/bad")).status_code == 400
            assert len(clock.sleeps) == held

    asyncio.run(scenario())


def test_past_max_held_waiting_requests_the_answer_is_an_immediate_429() -> None:
    clock = _Clock()
    release = asyncio.Event

    async def scenario() -> None:
        gate = release()

        async def held_sleep(seconds: float) -> None:
            clock.sleeps.append(seconds)
            await gate.wait()

        app = _throttled(clock, rate=1.0, burst=1, sleep=held_sleep)
        async with _client(app, "10.0.0.1") as client:
            assert (await client.get("/bad")).status_code == 400  # the burst is spent
            waiting = [asyncio.create_task(client.get("/bad")) for _ in range(MAX_HELD)]
            while len(clock.sleeps) < MAX_HELD:
                await asyncio.sleep(0)
            # each held request waits its own turn: 1 s, 2 s, ... at one refusal a second
            assert sorted(clock.sleeps) == [float(n) for n in range(1, MAX_HELD + 1)]
            refused = await client.get("/bad")
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == str(MAX_HELD + 1)
            assert refused.headers["connection"] == "close"
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            gate.set()
            assert [r.status_code for r in await asyncio.gather(*waiting)] == [400] * MAX_HELD

    asyncio.run(scenario())


@pytest.mark.integration
def test_the_proxy_holds_a_flooding_address_and_serves_the_others(
    tmp_path: Path, qwen35_tokenizer: Any
) -> None:
    """Through the real proxy: a client on 127.0.0.2 that sends only bad calls gets its burst at
    once and is then held; a client on 127.0.0.1 is answered at once, refusals and all."""
    tito = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    engine = ScriptedEngine(lambda body: EngineReply([1]), record=False)
    with engine.running() as engine_url:
        config = ProxyConfig(
            engine_url=engine_url,
            store_dir=tmp_path,
            engine_retries=0,
            client_refusal_rate=2.0,
            client_refusal_burst=5,
        )
        with serve_proxy(config, tito=tito) as url:
            hostile = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
            with hostile, httpx.Client() as other:
                chat = f"{url}/v1/chat/completions"
                for _ in range(5):
                    assert hostile.post(chat, json={}, timeout=10).status_code == 400
                try:
                    hostile.post(chat, json={}, timeout=0.2)
                    held = False
                except httpx.ReadTimeout:
                    held = True
                assert held, "the sixth refusal within the burst's second was not held"
                answer = other.post(chat, json={}, timeout=0.2)  # another address: at once
                assert answer.status_code == 400
                assert "session" in answer.json()["error"]["message"]
                assert other.get(f"{url}/health", timeout=0.2).status_code == 200
