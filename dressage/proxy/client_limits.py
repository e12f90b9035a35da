"""A client that keeps sending what the proxy refuses waits for its own answers.

    app.add_middleware(RefusalThrottle, rate=10.0, burst=50)   # create_app does this

Each client address (the TCP peer's host) has a budget of refusals: ``burst`` at once, refilled
at ``rate`` a second. Every answer of 400-499 spends one. A request from an address whose budget
is spent is held, before the proxy reads its body, until the budget has refilled by one, and is
then served as usual (so a client that mends its ways gets answers again); its answer is the
same, only later. A client on HTTP/1.1 sends nothing else on a connection while it waits, so a
flood of bad calls slows to ``rate`` a second, whatever the number of connections: holding costs
the proxy a sleeping task, no CPU, and the other sessions keep the event loop. At most
``MAX_HELD`` requests of one address are held at once; past that it gets an immediate 429 with
``Retry-After`` and ``Connection: close``, without its body being read.

Calls that succeed spend nothing: an agent whose calls are answered is never held, however fast.
While an address's budget is spent, though, all its requests wait, the good ones too (whether a
request will be refused is known only once it is served), and everyone behind one address (a
NAT, a load balancer in front of the proxy) shares a budget; ``--client-refusal-rate 0`` turns
the throttle off.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MAX_HELD", "RefusalThrottle"]

MAX_HELD = 64
"""Requests of one address held at once; more are answered 429 at once."""
_FORGET_S = 300.0
"""An address whose budget has been full this long is forgotten (memory stays bounded)."""


@dataclass
class _Budget:
    tokens: float
    at: float
    held: int = 0


class RefusalThrottle:
    """ASGI middleware: the refusal budget per client address (module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.app = app
        self.rate = rate
        self.burst = float(burst)
        self._clock, self._sleep = clock, sleep
        self._budgets: dict[str, _Budget] = {}
        self._swept = clock()

    def _budget(self, host: str, now: float) -> _Budget:
        budget = self._budgets.get(host)
        if budget is None:
            budget = self._budgets[host] = _Budget(self.burst, now)
        else:
            budget.tokens = min(self.burst, budget.tokens + (now - budget.at) * self.rate)
            budget.at = now
        return budget

    def _sweep(self, now: float) -> None:
        if now - self._swept < _FORGET_S:
            return
        self._swept = now
        full_since = self.burst / self.rate + _FORGET_S
        for host in [h for h, b in self._budgets.items() if not b.held and now - b.at > full_since]:
            del self._budgets[host]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or self.rate <= 0 or not client:
            await self.app(scope, receive, send)
            return
        host = str(client[0])
        now = self._clock()
        self._sweep(now)
        budget = self._budget(host, now)
        if budget.tokens < 1.0:
            if budget.held >= MAX_HELD:
                await _too_many(send, math.ceil((1.0 - budget.tokens) / self.rate))
                return
            budget.held += 1
            try:
                # each held request takes the next refill in turn: the debt grows per request
                budget.tokens -= 1.0
                await self._sleep(-budget.tokens / self.rate)
            finally:
                budget.held -= 1
            budget.tokens += 1.0  # the slot waited for is this request's, not a refusal yet
        await self.app(scope, receive, self._counting(budget, send))

    def _counting(self, budget: _Budget, send: Send) -> Send:
        async def send_and_count(message: Message) -> None:
            if message["type"] == "http.response.start" and 400 <= int(message["status"]) < 500:
                now = self._clock()
                budget.tokens = min(self.burst, budget.tokens + (now - budget.at) * self.rate)
                budget.at = now
                budget.tokens -= 1.0
            await send(message)

        return send_and_count


async def _too_many(send: Send, retry_after_s: int) -> None:
    body = (
        b'{"error":{"message":"too many refused requests from this address: wait for the '
        b'answers already pending","type":"rate_limit_error","param":null,'
        b'"code":"rate_limit_exceeded"}}'
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(max(1, retry_after_s)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
