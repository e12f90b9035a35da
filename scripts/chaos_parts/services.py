"""The engine and the proxy as the README starts them, as real subprocesses on loopback.

    with Services(workdir) as services:
        engine = services.engine(port)           # dressage engine serve --model TINY --port PORT
        engine.wait_ready()                      # its ready line: engine.url
        proxy = services.proxy(engine.url, store, port, "proxy")   # dressage-proxy ...
        proxy.wait_ready()
        proxy.kill9()                            # SIGKILL to its process group
        proxy.start()                            # the same command again

Each service runs in its own process group (``start_new_session``) with its output in a log
file under ``workdir``, and counts as started once it prints its ready line
(``DRESSAGE_ENGINE_URL=`` / ``DRESSAGE_PROXY_URL=``). Keys travel in the environment only,
``DRESSAGE_PROXY_ADMIN_KEY`` and ``DRESSAGE_ENGINE_ADMIN_KEY``, as the README exports them.
Leaving the ``with`` block kills every group still alive: no strays, whatever failed.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from dressage.engine.cli import READY_PREFIX as ENGINE_READY
from dressage.proxy.server import READY_PREFIX as PROXY_READY

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model() -> str:
    """The tiny model's folder, as the README finds it (``dressage assets``)."""
    out = subprocess.run(
        [str(BIN / "dressage"), "assets"], capture_output=True, text=True, check=True, timeout=600
    ).stdout
    for line in out.splitlines():
        if line.startswith("tiny model: "):
            return line.removeprefix("tiny model: ").strip()
    raise RuntimeError(f"`dressage assets` named no tiny model: {out!r}")


class Service:
    """One started process group; ``url`` once it printed its ready line."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log: Path, ready: str
    ) -> None:
        self.name, self.argv, self.env, self.log, self.ready = name, argv, env, log, ready
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.launched_at, self.offset = 0.0, 0

    def start(self) -> float:
        """Start (or start again, same command and log) and wait for the ready line; returns
        the seconds it took."""
        return self.launch().wait_ready()

    def launch(self) -> Service:
        """Start the process, without waiting for it to serve."""
        self.launched_at = time.monotonic()
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        self.url = ""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=REPO,
                start_new_session=True,
            )
        return self

    def wait_ready(self) -> float:
        """Wait for the ready line; the seconds since the launch."""
        started, offset = self.launched_at, self.offset
        assert self.proc is not None
        while time.monotonic() - started < START_TIMEOUT_S:
            text = self.log.read_bytes()[offset:].decode("utf-8", "replace")
            for line in text.splitlines():
                if line.startswith(self.ready):
                    self.url = line.removeprefix(self.ready).strip()
            if self.url and self.proc.poll() is None:
                return time.monotonic() - started
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}: see {self.log}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not start within {START_TIMEOUT_S} s: see {self.log}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """``kill -9`` of the whole process group, then reap it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def log_text(self) -> str:
        return self.log.read_text("utf-8", "replace")


class Services:
    """Starts the README's services; stops every one of them on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.model = tiny_model()
        self.proxy_key = secrets.token_hex(16)
        self.engine_key = secrets.token_hex(16)
        self.started: list[Service] = []
        self.env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        self.env["DRESSAGE_PROXY_ADMIN_KEY"] = self.proxy_key
        self.env["DRESSAGE_ENGINE_ADMIN_KEY"] = self.engine_key

    def __enter__(self) -> Services:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for service in self.started:
            if service.alive():
                service.kill9()

    def _launch(self, name: str, argv: list[str], ready: str) -> Service:
        service = Service(name, argv, self.env, self.workdir / f"{name}.log", ready)
        self.started.append(service)
        return service.launch()

    def engine(self, port: int) -> Service:
        """``dressage engine serve --model "$MODEL" --port PORT`` (the README's line), launched:
        its URL is ``http://127.0.0.1:PORT`` once ``wait_ready()`` returns."""
        argv = [
            str(BIN / "dressage"),
            "engine",
            "serve",
            "--model",
            self.model,
            "--port",
            str(port),
        ]
        return self._launch(f"engine-{port}", argv, ENGINE_READY)

    def proxy(self, engine_url: str, store: Path, port: int, name: str) -> Service:
        """``dressage-proxy --engine-url URL --port PORT --store-dir DIR --record-token-versions``,
        launched."""
        argv = [str(BIN / "dressage-proxy"), "--engine-url", engine_url, "--port", str(port)]
        argv += ["--store-dir", str(store), "--record-token-versions"]
        return self._launch(name, argv, PROXY_READY)

    def admin(self, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call of the proxy's admin routes with its key."""
        headers = {"authorization": f"Bearer {self.proxy_key}"}
        return httpx.request(method, f"{url}{path}", headers=headers, timeout=120, **kwargs)
