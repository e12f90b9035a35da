"""Start a real embedded engine for a test or a script, and stop it afterwards.

    from dressage.tiny import tiny_model_dir
    from dressage.engine.testing import serve_engine

    with serve_engine(tiny_model_dir()) as url:        # e.g. "http://127.0.0.1:41237"
        httpx.post(f"{url}/generate", json={"input_ids": [1, 2, 3]})

The server listens on 127.0.0.1 on a free port. By default it runs in this process (uvicorn on a
background thread: starts in a few seconds, no second copy of torch); ``subprocess=True`` runs
``dressage engine serve`` in a child process instead (isolation, e.g. for crash tests or when the
caller itself must stay responsive). Keyword options are :class:`EngineConfig` fields; tests
usually pass ``device="cpu", num_threads=1``. In-process, a CPU engine sets torch's intra-op
threads to 1 while it runs (its own lm_head workers use the cores) and restores them on exit.

Control routes (pause, abort, weight updates) take the key given as ``admin_api_key`` (or
``api_key``); with neither, the engine gets a fresh random admin key that nobody is told, so
its control routes stay closed. ``open_control_routes=True`` is the explicit opt-out. A child
process gets its keys through its environment, never on its command line.
"""

from __future__ import annotations

import os
import secrets
import subprocess as sp
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dressage.engine.cli import READY_PREFIX
from dressage.engine.config import ADMIN_KEY_ENV, API_KEY_ENV, EngineConfig
from dressage.health import wait_healthy
from dressage.serve_thread import serve_on_thread

__all__ = ["serve_engine"]


@contextmanager
def serve_engine(
    model_path: str | Path,
    *,
    subprocess: bool = False,
    startup_timeout: float = 180.0,
    **options: Any,
) -> Iterator[str]:
    """Serve ``model_path`` until the block ends; yields the base URL (no trailing slash)."""
    if not {"api_key", "admin_api_key", "open_control_routes"} & options.keys():
        options["admin_api_key"] = secrets.token_urlsafe(32)
    config = EngineConfig(model_path=str(model_path), host="127.0.0.1", port=0, **options)
    if subprocess:
        with _serve_subprocess(config, startup_timeout) as url:
            yield url
    else:
        with _serve_thread(config, startup_timeout) as url:
            yield url


@contextmanager
def _serve_thread(config: EngineConfig, startup_timeout: float) -> Iterator[str]:
    import uvicorn

    from dressage.engine.server import create_app

    server = uvicorn.Config(create_app(config), log_level="warning", timeout_graceful_shutdown=5)
    with serve_on_thread(
        server,
        name="the engine",
        thread_name="dressage-engine-http",
        startup_timeout=startup_timeout,
    ) as url:
        yield url


@contextmanager
def _serve_subprocess(config: EngineConfig, startup_timeout: float) -> Iterator[str]:
    argv = [sys.executable, "-m", "dressage.cli", "engine", "serve", "--model", config.model_path]
    argv += ["--host", "127.0.0.1", "--port", "0", "--device", config.device]
    for flag, value in (
        ("--tokenizer", config.tokenizer_path),
        ("--dtype", config.dtype),
        ("--weight-version", config.weight_version),
        ("--context-length", config.context_length),
        ("--max-running-requests", config.max_running_requests),
        ("--max-total-tokens", config.max_total_tokens),
        ("--max-prefill-tokens", config.max_prefill_tokens),
        ("--num-threads", config.num_threads),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if config.open_control_routes:
        argv.append("--open-control-routes")
    env = {k: v for k, v in os.environ.items() if k not in (ADMIN_KEY_ENV, API_KEY_ENV)}
    for name, key in ((ADMIN_KEY_ENV, config.admin_api_key), (API_KEY_ENV, config.api_key)):
        if key is not None:
            env[name] = key
    proc = sp.Popen(argv, stdout=sp.PIPE, text=True, env=env)
    try:
        url = _read_url(proc, startup_timeout)
        wait_healthy(url, startup_timeout, name="the engine", alive=lambda: proc.poll() is None)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except sp.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_url(proc: sp.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    found: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX) and not found:
                found.append(line[len(READY_PREFIX) :].strip())

    threading.Thread(target=reader, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with code {proc.returncode} before serving")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine did not start within {timeout} s")
        time.sleep(0.05)
    return found[0]
