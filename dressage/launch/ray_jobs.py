"""Ray Jobs as the launcher of a cluster, over the dashboard's REST API (no ray import).

    launcher = RayJobsLauncher("http://head:8265")
    launcher.submit(JobSpec("python3 -m dressage.jobs.train --run-config /mnt/nfs/run.json",
                            submission_id="dressage-dressage_mopd-scheduled-1-train",
                            env={"DRESSAGE_MOPD_CONFIG": "/mnt/nfs/mopd.json"}))

The same calls as ``ray job submit|status|logs|stop`` (POST /api/jobs/, GET /api/jobs/{id},
GET /api/jobs/{id}/logs, POST /api/jobs/{id}/stop). The submission id is the job's key: Ray
refuses a second job under an id, so ``submit`` first asks for it and reattaches to a pending,
running or succeeded job. A failed or stopped one stays (its log is evidence) and the new attempt
runs as ``<id>-r1``, ``<id>-r2``, ...; ``status``, ``logs`` and ``stop`` of the base id always
mean its latest attempt. (Deleting and reusing the id races with Ray's cleanup of the old job's
supervisor actor, which then kills the new one.)

The environment travels as the runtime env's ``env_vars``; a local ``working_dir`` becomes a
``cd`` in front of the entrypoint (the cluster must see that path, e.g. a shared mount) and a URI
(``s3://…zip``) stays in the runtime env. Nothing here imports ray, so Airflow workers and
triggerers need only httpx.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx

from dressage.launch.base import (
    JobSpec,
    JobState,
    JobStatus,
    LauncherKind,
    LaunchError,
    tail_lines,
)

__all__ = ["RayJobsLauncher", "RayJobsStatusClient"]

_REPLACEABLE = (JobState.FAILED, JobState.STOPPED)
MAX_ATTEMPTS = 50


def attempt_id(submission_id: str, attempt: int) -> str:
    return submission_id if attempt == 0 else f"{submission_id}-r{attempt}"


def _entrypoint(spec: JobSpec) -> str:
    command = spec.command()
    if spec.working_dir and "://" not in spec.working_dir:
        return f"cd {shlex.quote(spec.working_dir)} && {command}"
    return command


def _status(address: str, data: dict[str, Any]) -> JobStatus:
    sid = str(data.get("submission_id") or data.get("job_id"))
    return JobStatus(
        submission_id=sid,
        state=JobState(str(data.get("status", "PENDING"))),
        message=str(data.get("message") or ""),
        exit_code=data.get("driver_exit_code"),
        log=f"{address}/#/jobs/{sid}",
    )


def _unreachable(address: str, exc: Exception) -> LaunchError:
    return LaunchError(
        f"the Ray dashboard at {address} is unreachable ({type(exc).__name__}: {exc}); "
        "check the ray_address and that the head node runs with its dashboard"
    )


def _parse(address: str, sid: str, response: httpx.Response) -> JobStatus | None:
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        raise LaunchError(
            f"Ray at {address}: status of job {sid} failed (HTTP {response.status_code}): "
            f"{tail_lines(response.text, 3)}"
        )
    return _status(address, response.json())


def _attempts_sync(get: Callable[[str], JobStatus | None], sid: str) -> list[JobStatus]:
    """Every attempt of ``sid`` in order; only the last may be pending, running or succeeded."""
    found: list[JobStatus] = []
    for attempt in range(MAX_ATTEMPTS):
        status = get(attempt_id(sid, attempt))
        if status is None:
            break
        found.append(status)
        if status.state not in _REPLACEABLE:
            break
    return found


async def _attempts_async(
    get: Callable[[str], Awaitable[JobStatus | None]], sid: str
) -> list[JobStatus]:
    found: list[JobStatus] = []
    for attempt in range(MAX_ATTEMPTS):
        status = await get(attempt_id(sid, attempt))
        if status is None:
            break
        found.append(status)
        if status.state not in _REPLACEABLE:
            break
    return found


class RayJobsLauncher:
    kind: LauncherKind = "ray"

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        stop_grace_s: float = 30.0,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
    ) -> None:
        self.address = address.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.stop_grace_s = float(stop_grace_s)
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.entrypoint_num_gpus = entrypoint_num_gpus

    def options(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "timeout_s": self.timeout_s,
            "stop_grace_s": self.stop_grace_s,
            "entrypoint_num_cpus": self.entrypoint_num_cpus,
            "entrypoint_num_gpus": self.entrypoint_num_gpus,
        }

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            with httpx.Client(timeout=self.timeout_s) as client:
                return client.request(method, f"{self.address}{path}", **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self.address, exc) from exc

    def _get(self, sid: str) -> JobStatus | None:
        return _parse(self.address, sid, self._request("GET", f"/api/jobs/{sid}"))

    def ping(self) -> str:
        """The cluster's Ray version; raises :class:`LaunchError` naming an unreachable address."""
        response = self._request("GET", "/api/version")
        if response.status_code != 200:
            raise LaunchError(
                f"{self.address} answers HTTP {response.status_code} to /api/version: is it a "
                "Ray dashboard?"
            )
        return str(response.json().get("ray_version", "?"))

    def submit(self, spec: JobSpec) -> JobStatus:
        attempts = _attempts_sync(self._get, spec.submission_id)
        if attempts and attempts[-1].state not in _REPLACEABLE:
            return replace(attempts[-1], reattached=True)
        if len(attempts) >= MAX_ATTEMPTS:
            raise LaunchError(f"job {spec.submission_id} failed {MAX_ATTEMPTS} times on Ray")
        sid = attempt_id(spec.submission_id, len(attempts))
        runtime_env: dict[str, Any] = {"env_vars": dict(spec.env)}
        if spec.working_dir and "://" in spec.working_dir:
            runtime_env["working_dir"] = spec.working_dir
        body: dict[str, Any] = {
            "entrypoint": _entrypoint(spec),
            "submission_id": sid,
            "runtime_env": runtime_env,
            "metadata": {"launched_by": "dressage", "base_id": spec.submission_id},
        }
        body["metadata"].update(spec.metadata)
        if self.entrypoint_num_cpus is not None:
            body["entrypoint_num_cpus"] = self.entrypoint_num_cpus
        if self.entrypoint_num_gpus is not None:
            body["entrypoint_num_gpus"] = self.entrypoint_num_gpus
        response = self._request("POST", "/api/jobs/", json=body)
        if response.status_code >= 400:
            if "already exists" in response.text:  # a concurrent submit won the race
                found = self._get(sid)
                if found is not None:
                    return replace(found, reattached=True)
            raise LaunchError(
                f"Ray at {self.address} refused job {sid} "
                f"(HTTP {response.status_code}): {tail_lines(response.text, 5)}"
            )
        return self._get(sid) or JobStatus(sid, JobState.PENDING, "submitted")

    def status(self, submission_id: str) -> JobStatus | None:
        """The latest attempt of ``submission_id``; None when it was never submitted."""
        attempts = _attempts_sync(self._get, submission_id)
        return attempts[-1] if attempts else None

    def logs(self, submission_id: str, *, tail: int | None = None) -> str:
        latest = self.status(submission_id)
        sid = latest.submission_id if latest else submission_id
        response = self._request("GET", f"/api/jobs/{sid}/logs")
        if response.status_code >= 400:
            raise LaunchError(
                f"Ray at {self.address}: no logs for job {sid} (HTTP {response.status_code})"
            )
        return tail_lines(str(response.json().get("logs", "")), tail)

    def stop(self, submission_id: str) -> JobStatus | None:
        """Ask Ray to stop the latest attempt and wait (``stop_grace_s``) until it has ended."""
        current = self.status(submission_id)
        if current is None or current.state.terminal:
            return current
        self._request("POST", f"/api/jobs/{current.submission_id}/stop")
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline:
            found = self._get(current.submission_id)
            if found is None or found.state.terminal:
                return found
            time.sleep(0.5)
        return self._get(current.submission_id)


class RayJobsStatusClient:
    """Async status, logs and stop over the same REST API, for triggers."""

    def __init__(self, address: str, *, timeout_s: float = 30.0, **_launcher_options: Any) -> None:
        self.address = address.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.address, timeout=timeout_s)

    async def _call(self, method: str, path: str) -> httpx.Response:
        try:
            return await self._client.request(method, path)
        except httpx.TransportError as exc:
            raise _unreachable(self.address, exc) from exc

    async def _get(self, sid: str) -> JobStatus | None:
        return _parse(self.address, sid, await self._call("GET", f"/api/jobs/{sid}"))

    async def status(self, submission_id: str) -> JobStatus | None:
        attempts = await _attempts_async(self._get, submission_id)
        return attempts[-1] if attempts else None

    async def read_log(self, submission_id: str, offset: int) -> tuple[str, int]:
        latest = await self.status(submission_id)
        if latest is None:
            return "", offset
        # The REST API serves the whole log; the slice after offset is what is new.
        response = await self._call("GET", f"/api/jobs/{latest.submission_id}/logs")
        if response.status_code >= 400:
            return "", offset
        text = str(response.json().get("logs", ""))
        end = text.rfind("\n") + 1
        return (text[offset:end], end) if end > offset else ("", offset)

    async def stop(self, submission_id: str) -> None:
        latest = await self.status(submission_id)
        if latest is not None and not latest.state.terminal:
            await self._call("POST", f"/api/jobs/{latest.submission_id}/stop")

    async def aclose(self) -> None:
        await self._client.aclose()
