"""The long-lived services of an embedded run: the engine and the recording proxy, as local jobs.

    services = start_services(LocalLauncher(run_dir / "jobs"), ServicePlan(
        student=Path("~/.cache/dressage/models/tiny-…"), store_dir=run_dir / "proxy-store",
        admin_key_file=run_dir / "secrets/proxy_admin_key", id_prefix="dressage-dag-run"))
    ...                                    # services.engine_url, services.proxy_url
    stop_services(launcher, services.submission_ids)

Each announces its URL on one stdout line (``DRESSAGE_ENGINE_URL=…``, ``DRESSAGE_PROXY_URL=…``;
the proxy binds port 0, the engine a port picked here so the proxy can start beside it); a
service is ready when that URL answers ``GET /health`` with 200.
Starting again with the same ids reattaches to services that still run (a retried task). Two
keys are generated into 0600 files beside each other and read into the services' environments:
the proxy's admin key (``DRESSAGE_PROXY_ADMIN_KEY``, for the proxy) and the engine's control
key (``DRESSAGE_ENGINE_ADMIN_KEY``, for the engine and for the proxy, which pauses and aborts
through it; the training job gets it the same way, for its weight updates). Neither ever appears
on a command line, in a Param or in an XCom. On a Ray cluster these services belong to the job
itself (SGLang and the proxy inside slime).
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from dressage.launch.base import JobSpec, JobState, LaunchError
from dressage.launch.local import LocalLauncher

__all__ = [
    "ENGINE_READY_PREFIX",
    "PROXY_READY_PREFIX",
    "ServicePlan",
    "Services",
    "start_services",
    "stop_services",
    "write_secret",
]

# The ready lines of `dressage engine serve` and `dressage-proxy` (checked by a contract test).
ENGINE_READY_PREFIX = "DRESSAGE_ENGINE_URL="
PROXY_READY_PREFIX = "DRESSAGE_PROXY_URL="
ADMIN_KEY_ENV = "DRESSAGE_PROXY_ADMIN_KEY"
ENGINE_KEY_ENV = "DRESSAGE_ENGINE_ADMIN_KEY"


@dataclass(frozen=True)
class ServicePlan:
    student: Path
    """HF folder of the student: the engine's weights, the proxy's tokenizer."""
    store_dir: Path
    admin_key_file: Path
    id_prefix: str
    partial_rollout: bool = True
    ready_timeout_s: float = 300.0
    engine_key_file: Path | None = None
    """The engine's control key; None: ``engine_admin_key`` beside ``admin_key_file``."""

    @property
    def engine_key_path(self) -> Path:
        return self.engine_key_file or self.admin_key_file.with_name("engine_admin_key")


@dataclass(frozen=True)
class Services:
    engine_url: str
    proxy_url: str
    engine_id: str
    proxy_id: str

    @property
    def submission_ids(self) -> list[str]:
        return [self.engine_id, self.proxy_id]


def write_secret(path: Path) -> Path:
    """A fresh random key in ``path`` (mode 0600), unless one is there already (a retry)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _engine_spec(plan: ServicePlan, port: int) -> JobSpec:
    argv = [sys.executable, "-m", "dressage.cli", "engine", "serve", "--model", str(plan.student)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--weight-version", "0"]
    return JobSpec(
        argv,
        submission_id=f"{plan.id_prefix}-engine",
        env={ENGINE_KEY_ENV: plan.engine_key_path.read_text().strip()},
        metadata={"service": "engine"},
    )


def _proxy_spec(plan: ServicePlan, engine_url: str) -> JobSpec:
    argv = [sys.executable, "-m", "dressage.proxy.server", "--engine-url", engine_url]
    argv += ["--host", "127.0.0.1", "--port", "0", "--store-dir", str(plan.store_dir)]
    argv += ["--tokenizer-path", str(plan.student)]
    if plan.partial_rollout:
        argv += ["--dressage-partial-rollout", "--record-token-versions"]
    env = {
        ADMIN_KEY_ENV: plan.admin_key_file.read_text().strip(),
        ENGINE_KEY_ENV: plan.engine_key_path.read_text().strip(),
    }
    return JobSpec(
        argv, submission_id=f"{plan.id_prefix}-proxy", env=env, metadata={"service": "proxy"}
    )


def start_services(launcher: LocalLauncher, plan: ServicePlan) -> Services:
    """Start (or find) the engine and the proxy in front of it; wait until both are healthy.

    Both load at once (the proxy needs no live engine to start), so the engine's port is
    chosen here; a reattached engine keeps the URL it announced. When either cannot be made
    ready, both are stopped before the error propagates (no teardown runs for a failed setup).
    """
    write_secret(plan.admin_key_file)
    write_secret(plan.engine_key_path)
    port = _free_port()
    engine_spec = _engine_spec(plan, port)
    proxy_id = f"{plan.id_prefix}-proxy"
    try:
        return _start(launcher, plan, engine_spec, port)
    except LaunchError:
        stop_services(launcher, [engine_spec.submission_id, proxy_id])
        raise


def _start(launcher: LocalLauncher, plan: ServicePlan, engine_spec: JobSpec, port: int) -> Services:
    engine = launcher.submit(engine_spec)
    if engine.reattached:
        engine_url = wait_ready(launcher, engine.submission_id, ENGINE_READY_PREFIX, plan)
    else:
        engine_url = f"http://127.0.0.1:{port}"
    proxy_spec = _proxy_spec(plan, engine_url)
    if not engine.reattached:  # a proxy still running from before points at the old engine
        launcher.stop(proxy_spec.submission_id)
    proxy = launcher.submit(proxy_spec)
    announced = wait_ready(launcher, engine.submission_id, ENGINE_READY_PREFIX, plan)
    if announced != engine_url:
        raise LaunchError(f"engine {engine.submission_id} serves {announced}, not {engine_url}")
    proxy_url = wait_ready(launcher, proxy.submission_id, PROXY_READY_PREFIX, plan)
    return Services(engine_url, proxy_url, engine.submission_id, proxy.submission_id)


def wait_ready(launcher: LocalLauncher, submission_id: str, prefix: str, plan: ServicePlan) -> str:
    """The URL the service announced, once ``GET <url>/health`` answers 200."""
    deadline = time.monotonic() + plan.ready_timeout_s
    url: str | None = None
    while time.monotonic() < deadline:
        status = launcher.status(submission_id)
        if status is None or status.state != JobState.RUNNING:
            state = status.state.value if status else "missing"
            raise LaunchError(
                f"service {submission_id} is {state} before becoming ready; last lines of its "
                f"log ({launcher.job_dir(submission_id) / 'job.log'}):\n"
                f"{launcher.logs(submission_id, tail=30) if status else ''}"
            )
        url = url or _announced(launcher.logs(submission_id), prefix)
        if url and _healthy(url):
            return url
        time.sleep(0.5)
    raise LaunchError(
        f"service {submission_id} was not healthy within {plan.ready_timeout_s:.0f} s "
        f"(announced URL: {url}); last lines of its log:\n{launcher.logs(submission_id, tail=30)}"
    )


def _announced(log: str, prefix: str) -> str | None:
    urls = [line[len(prefix) :].strip() for line in log.splitlines() if line.startswith(prefix)]
    return urls[-1] if urls else None


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop_services(launcher: LocalLauncher, submission_ids: list[str]) -> dict[str, str]:
    """Stop each service (proxy first, so no request reaches a stopped engine); final states."""
    states: dict[str, str] = {}
    for sid in reversed(submission_ids):
        found = launcher.stop(sid)
        states[sid] = found.state.value if found else "missing"
    return states
