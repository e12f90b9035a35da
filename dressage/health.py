"""Waiting for a service's ``GET /health`` to answer 200 (the engine, the proxy, their tests)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

__all__ = ["wait_healthy"]


def wait_healthy(
    url: str,
    timeout_s: float,
    *,
    name: str = "the service",
    alive: Callable[[], bool] | None = None,
    interval_s: float = 0.05,
) -> None:
    """Return once ``{url}/health`` answers 200.

    Raises:
        RuntimeError: ``alive()`` turned false first (the process or thread behind it ended).
        TimeoutError: not healthy within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"{name} at {url} stopped before serving")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"{name} at {url} was not healthy within {timeout_s:.0f} s")
