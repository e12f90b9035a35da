"""The real sglang-router 0.3.2 (the test extra pins it) in front of an engine, for tests.

    with serve_router(engine_url) as router_url:
        httpx.post(f"{router_url}/generate", json=...)

It is the router slime installs (docs/sglang.md section 6): a Rust binary in a Python wheel that
runs on a CPU machine. It starts as ``python -m sglang_router.launch_router`` on a free loopback
port with retries off (a test's refused call should fail once, not five times) and is stopped
when the block ends.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_router(
    worker_url: str, *, log_file: Path, startup_timeout: float = 60.0
) -> Iterator[str]:
    """sglang-router in front of ``worker_url`` until the block ends; yields its URL."""
    port = _free_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", worker_url,
        "--host", "127.0.0.1", "--port", str(port), "--disable-retries", "--log-level", "warn",
        # its metrics listener defaults to the fixed port 29000: two routers at once (tests
        # in parallel) collided there, and the second one failed to start
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log_file.open("wb") as log:
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + startup_timeout
            while not _serves(url, worker_url):
                if router.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sglang-router did not start; see {log_file}")
                time.sleep(0.2)
            yield url
        finally:
            router.terminate()
            router.wait(timeout=30)


def _serves(url: str, worker_url: str) -> bool:
    """The router answers and lists ``worker_url`` as a healthy worker."""
    try:
        workers = httpx.get(f"{url}/workers", timeout=2).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return any(w["url"] == worker_url and w["is_healthy"] for w in workers)
