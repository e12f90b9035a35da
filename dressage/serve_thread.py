"""Serving an ASGI app with uvicorn on a background thread, on a free loopback port.

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    with serve_on_thread(config, name="the engine", thread_name="dressage-engine-http") as url:
        httpx.get(f"{url}/health")                     # url: e.g. "http://127.0.0.1:41237"

What the in-process servers of :mod:`dressage.engine.testing` and :mod:`dressage.proxy.testing`
share, written once. The socket is bound before the thread starts, so the URL is known up front
and no other process can take the port in between; the block runs once ``GET /health`` answers
200 (:func:`~dressage.health.wait_healthy`), and fails at once if the server thread ends before
that. Leaving the block asks uvicorn to exit and waits for the thread: open connections get the
config's ``timeout_graceful_shutdown``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dressage.health import wait_healthy

if TYPE_CHECKING:
    import uvicorn

__all__ = ["serve_on_thread"]

_JOIN_TIMEOUT_S = 30.0
"""Longest the exit waits for the server thread (uvicorn's graceful shutdown is shorter)."""


@contextmanager
def serve_on_thread(
    config: uvicorn.Config,
    *,
    name: str,
    thread_name: str,
    startup_timeout: float,
    interval_s: float = 0.05,
) -> Iterator[str]:
    """Serve ``config``'s app until the block ends; yields the base URL (no trailing slash).

    ``name`` is what a startup error calls the server; ``interval_s`` is how often its health
    is polled while it starts. The config's own host and port are not used.

    Raises:
        RuntimeError: the server thread ended before it was healthy.
        TimeoutError: not healthy within ``startup_timeout`` seconds.
    """
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=thread_name, daemon=True
    )
    thread.start()
    try:
        wait_healthy(url, startup_timeout, name=name, alive=thread.is_alive, interval_s=interval_s)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=_JOIN_TIMEOUT_S)
        sock.close()
