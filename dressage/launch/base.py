"""The launcher port: run a job (an entrypoint, its environment, a working folder) somewhere.

Two adapters share this contract: :mod:`dressage.launch.local` (processes on this machine, the
embedded default) and :mod:`dressage.launch.ray_jobs` (the Ray Jobs API of a cluster)::

    launcher = launcher_for("local", {"root": "runs/jobs"})      # or ("ray", {"address": URL})
    status = launcher.submit(JobSpec(["python", "-m", "x"], submission_id="dressage-a-b-c"))
    launcher.status(status.submission_id)                        # JobStatus | None
    launcher.logs(status.submission_id, tail=50)
    launcher.stop(status.submission_id)

A submission id is the job's identity: submitting an id that is running or finished returns that
job (``reattached=True``) instead of starting a second one, so a retried Airflow task reconnects;
an id whose job failed or was stopped is replaced by a fresh attempt. Triggers poll through an
:class:`AsyncStatusClient` (no ray import, nothing blocking), made by :func:`status_client_for`
from the JSON-safe ``options`` of a launcher.
"""

from __future__ import annotations

import enum
import hashlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "AsyncStatusClient",
    "JobSpec",
    "JobState",
    "JobStatus",
    "LaunchError",
    "Launcher",
    "LauncherKind",
    "launcher_for",
    "sanitize_id",
    "status_client_for",
    "submission_id",
    "tail_lines",
]

LauncherKind = Literal["local", "ray"]
MAX_ID_LENGTH = 96


class LaunchError(RuntimeError):
    """A job could not be submitted, found or stopped; the message names the job and the place."""


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


@dataclass(frozen=True)
class JobSpec:
    """What to run. ``entrypoint`` is an argv list (exec'd) or a shell command string."""

    entrypoint: list[str] | str
    submission_id: str
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Variables for the job; may hold secrets, so never logged or stored by a launcher."""
    working_dir: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def command(self) -> str:
        """The entrypoint as one shell command line."""
        if isinstance(self.entrypoint, str):
            return self.entrypoint
        return shlex.join(self.entrypoint)


@dataclass(frozen=True)
class JobStatus:
    submission_id: str
    state: JobState
    message: str = ""
    exit_code: int | None = None
    log: str = ""
    """Where the job's log lives: a file path (local) or a dashboard URL (Ray)."""
    reattached: bool = False
    """True when ``submit`` found this id already running or finished and started nothing."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data


class Launcher(Protocol):
    kind: LauncherKind

    def options(self) -> dict[str, Any]:
        """JSON-safe keyword arguments that rebuild this launcher (for triggers, XComs)."""
        ...

    def submit(self, spec: JobSpec) -> JobStatus: ...

    def status(self, submission_id: str) -> JobStatus | None: ...

    def logs(self, submission_id: str, *, tail: int | None = None) -> str: ...

    def stop(self, submission_id: str) -> JobStatus | None: ...


class AsyncStatusClient(Protocol):
    """What a trigger needs, without blocking the event loop."""

    async def status(self, submission_id: str) -> JobStatus | None: ...

    async def read_log(self, submission_id: str, offset: int) -> tuple[str, int]:
        """New log text from ``offset`` (characters) on, and the next offset."""
        ...

    async def stop(self, submission_id: str) -> None: ...

    async def aclose(self) -> None: ...


def launcher_for(kind: str, options: Mapping[str, Any]) -> Launcher:
    """A launcher of ``kind`` ("local" or "ray") from its :meth:`Launcher.options`."""
    if kind == "local":
        from dressage.launch.local import LocalLauncher

        return LocalLauncher(**options)
    if kind == "ray":
        from dressage.launch.ray_jobs import RayJobsLauncher

        return RayJobsLauncher(**options)
    raise LaunchError(f"unknown launcher {kind!r}; expected 'local' or 'ray'")


def status_client_for(kind: str, options: Mapping[str, Any]) -> AsyncStatusClient:
    """The async status client of a launcher ``kind`` (used inside triggers)."""
    if kind == "local":
        from dressage.launch.local import LocalStatusClient

        return LocalStatusClient(**options)
    if kind == "ray":
        from dressage.launch.ray_jobs import RayJobsStatusClient

        return RayJobsStatusClient(**options)
    raise LaunchError(f"unknown launcher {kind!r}; expected 'local' or 'ray'")


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def sanitize_id(raw: str, *, max_length: int = MAX_ID_LENGTH) -> str:
    """``raw`` as a file- and URL-safe name; too long a name keeps its head plus a digest."""
    safe = _UNSAFE.sub("-", raw).strip("-.") or "x"
    if len(safe) <= max_length:
        return safe
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    return f"{safe[: max_length - 11].rstrip('-.')}-{digest}"


def submission_id(
    dag_id: str, run_id: str, task_id: str, map_index: int = -1, *, part: str | None = None
) -> str:
    """``dressage-<dag>-<run>-<task>[-<map>][-<part>]``, sanitised and length-capped.

    Deterministic, so a retried task computes the same id and finds its job again.
    """
    pieces = ["dressage", dag_id, run_id, task_id]
    if map_index >= 0:
        pieces.append(str(map_index))
    if part:
        pieces.append(part)
    return sanitize_id("-".join(pieces))


def tail_lines(text: str, n: int | None) -> str:
    """The last ``n`` lines of ``text`` (all of it when ``n`` is None)."""
    if n is None:
        return text
    lines = text.splitlines()
    return "\n".join(lines[-n:]) if n > 0 else ""
