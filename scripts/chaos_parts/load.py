"""Parts 3 and 4: many keep-alive sessions at once, then the engine killed under calls.

Part 3 (soak): ``sessions`` agents on the SDK's ``AsyncOpenAI``, each its own client with the
SDK's default connection pool (httpx: connections kept 5 s), no SDK retries (every error is
seen), multi-turn, thinking ``think`` seconds between calls. The full run thinks 4-6 s: a
connection idle about 5 s is where a server that closes idle connections at 5 s races the
client reusing it (issue 15's ReadError, ~1 call in 1,000 before the fix).

Part 4 (engine death): ``calls`` long calls (half of them streamed) are running in the engine
when it gets ``kill -9``. Measured from the kill: when each call ended and how (a status, or
the error a stream raised; a call still open after 120 s counts as ``hung``), how long a new
call takes to be refused, when ``/ready`` says 503 and what, then the engine is started again
on its port and every session makes its call again.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from typing import Any

import httpx
import openai

from .kills import ERRORS, NO_THINK, error_kind
from .services import Service

HUNG_S = 120.0


def _client(url: str, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/sessions/{session}/v1", api_key="unused", max_retries=0, timeout=HUNG_S
    )


async def _soak(url: str, sessions: int, seconds: float, think: tuple[float, float]) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    calls = 0

    async def agent(i: int) -> None:
        nonlocal calls
        rng = random.Random(i)
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Hello, agent {i}."}]
        pause = rng.uniform(0, think[1])  # the agents start staggered
        async with _client(url, f"soak-{i:03d}") as client:
            while loop.time() + pause < deadline:  # no call starts after the deadline
                await asyncio.sleep(pause)
                pause = rng.uniform(*think)
                started = loop.time()
                calls += 1
                try:
                    # two tokens: the soak is about connections, not generation
                    answer = await client.chat.completions.create(**_options(messages, 2))
                except ERRORS as exc:
                    errors[error_kind(exc)] += 1
                else:
                    latencies.append(loop.time() - started)
                    messages.append(answer.choices[0].message.model_dump(exclude_none=True))
                    messages.append({"role": "user", "content": f"And then ({len(messages)})?"})

    started = loop.time()
    await asyncio.gather(*(agent(i) for i in range(sessions)))
    return calls, errors, latencies, loop.time() - started


def soak(url: str, *, sessions: int, seconds: float, think: tuple[float, float]) -> dict[str, Any]:
    """Part 3: the figures of ``sessions`` agents calling for ``seconds``."""
    calls, errors, latencies, wall = asyncio.run(_soak(url, sessions, seconds, think))
    latencies.sort()
    failed = sum(errors.values())
    return {
        "sessions": sessions,
        "seconds": seconds,
        "think_s": list(think),
        "calls": calls,
        "answered": len(latencies),
        "errors": dict(errors),
        "failed": failed,
        "failed_per_1000": round(1000 * failed / max(calls, 1), 3),
        "calls_per_s": round(calls / wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3)
        if latencies
        else None,
    }


def _options(messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    return {"model": "dressage", "messages": messages, "max_tokens": max_tokens,
            "extra_body": NO_THINK}  # fmt: skip


async def _call(client: openai.AsyncOpenAI, *, stream: bool, max_tokens: int) -> str:
    """One call to its end: ``answered``, ``stream ended`` (no error), or the error's kind."""
    options = _options([{"role": "user", "content": "Tell me a long story."}], max_tokens)
    try:
        if not stream:
            await client.chat.completions.create(**options)
            return "answered"
        finish = None
        async for chunk in await client.chat.completions.create(stream=True, **options):
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        return "answered" if finish else "stream ended without error or finish"
    except ERRORS as exc:
        return ("stream: " if stream else "") + error_kind(exc)


async def _engine_running(engine_url: str, n: int) -> int:
    """Until the engine holds ``n`` requests (running or waiting); bounded."""
    got = 0
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(1200):
            loads = (await http.get(f"{engine_url}/v1/loads?include=core")).json()["loads"][0]
            got = loads["num_running_reqs"] + loads["num_waiting_reqs"]
            if got >= n:
                return int(got)
            await asyncio.sleep(0.05)
    return int(got)


async def _ready_503(url: str, since: float) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(600):
            ready = await http.get(f"{url}/ready")
            if ready.status_code == 503:
                return {"s": round(time.monotonic() - since, 3), "body": ready.json()}
            await asyncio.sleep(0.05)
    return {"s": None, "body": None}


async def _ready_200(url: str, since: float) -> float | None:
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(2400):
            if (await http.get(f"{url}/ready")).status_code == 200:
                return round(time.monotonic() - since, 3)
            await asyncio.sleep(0.05)
    return None


async def _timed(call: Any) -> tuple[str, float]:
    """The call's outcome and when it ended (``time.monotonic()``)."""
    outcome = await call
    return outcome, time.monotonic()


async def _engine_death(engine: Service, url: str, calls: int) -> dict[str, Any]:
    clients = [_client(url, f"death-{i:02d}") for i in range(calls)]
    tasks = [
        asyncio.create_task(_timed(_call(c, stream=i % 2 == 1, max_tokens=2000)))
        for i, c in enumerate(clients)
    ]
    running = await _engine_running(engine.url, calls)
    engine.kill9()
    killed_at = time.monotonic()
    ready = asyncio.create_task(_ready_503(url, killed_at))
    done, pending = await asyncio.wait(tasks, timeout=HUNG_S)
    for task in pending:
        task.cancel()
    ended = [task.result() for task in done]
    fresh_started = time.monotonic()
    fresh = await _call(clients[0], stream=False, max_tokens=4)
    fresh_s = time.monotonic() - fresh_started
    ready_503 = await ready
    restarted = time.monotonic()
    restart_s = await asyncio.to_thread(engine.start)
    ready_again = await _ready_200(url, restarted)
    retries = await asyncio.gather(
        *(_call(c, stream=i % 2 == 1, max_tokens=8) for i, c in enumerate(clients))
    )
    for client in clients:
        await client.close()
    times = sorted(at - killed_at for _, at in ended)
    return {
        "calls": calls,
        "in_engine_at_kill": running,
        "outcomes": dict(Counter(outcome for outcome, _ in ended)),
        "hung": len(pending),
        "ended_after_kill_s": {"min": round(times[0], 3), "max": round(times[-1], 3)}
        if times
        else None,
        "new_call": {"outcome": fresh, "s": round(fresh_s, 3)},
        "ready_503": ready_503,
        "engine_restart_s": round(restart_s, 2),
        "ready_200_after_restart_s": ready_again,
        "retries": dict(Counter(retries)),
    }


def engine_death(engine: Service, url: str, *, calls: int) -> dict[str, Any]:
    """Part 4 (the engine is started again before it returns)."""
    return asyncio.run(_engine_death(engine, url, calls))
