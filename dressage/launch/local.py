"""Local processes as jobs: the launcher of the embedded default.

    launcher = LocalLauncher("runs/demo/jobs")
    launcher.submit(JobSpec([sys.executable, "-m", "dressage.jobs.train", "--run-config", p],
                            submission_id="dressage-dressage_mopd-manual-1-train"))

Each job gets a folder ``<root>/<submission_id>/``: ``job.log`` (stdout and stderr),
``state.json`` (pid, start time, entrypoint, names of the variables it got; never their values)
and ``exit.json`` (written by :mod:`dressage.launch.supervisor` when the job ends). The job runs
in its own session, so it survives the Airflow task that started it and can be stopped as a
group: SIGTERM, then SIGKILL after ``stop_grace_s``. A process is recognised by pid *and* start
time, so a recycled pid is never mistaken for the job. Linux only (``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from dressage.launch.base import (
    JobSpec,
    JobState,
    JobStatus,
    LauncherKind,
    LaunchError,
    tail_lines,
)
from dressage.launch.supervisor import write_exit

__all__ = ["LocalLauncher", "LocalStatusClient"]

# A job that failed or was stopped is replaced by a new attempt; any other state is reattached.
_REPLACEABLE = (JobState.FAILED, JobState.STOPPED)
# Popen objects of jobs this process started: polled so finished ones do not linger as zombies.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid``, or None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _alive(pid: int, start_ticks: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]
    found = _proc_stat(pid)
    return found is not None and found[0] not in "ZX" and found[1] == start_ticks


class LocalLauncher:
    kind: LauncherKind = "local"

    def __init__(self, root: str | os.PathLike[str], *, stop_grace_s: float = 10.0) -> None:
        self.root = Path(root).expanduser().resolve()
        self.stop_grace_s = float(stop_grace_s)

    def options(self) -> dict[str, Any]:
        return {"root": str(self.root), "stop_grace_s": self.stop_grace_s}

    def job_dir(self, submission_id: str) -> Path:
        return self.root / submission_id

    # -- submit -----------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobStatus:
        """Start ``spec``, or return the running/finished job of the same submission id."""
        with self._lock(spec.submission_id):
            current = self.status(spec.submission_id)
            if current is not None and current.state not in _REPLACEABLE:
                return replace(current, reattached=True)
            if current is not None:
                self._archive(spec.submission_id)
            return self._start(spec)

    @contextlib.contextmanager
    def _lock(self, submission_id: str) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{submission_id}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _archive(self, submission_id: str) -> None:
        """Keep a failed attempt's folder (its log is evidence) beside the new one."""
        attempt = 1
        while self.root.joinpath(f"{submission_id}.attempt-{attempt}").exists():
            attempt += 1
        self.job_dir(submission_id).rename(self.root / f"{submission_id}.attempt-{attempt}")

    def _start(self, spec: JobSpec) -> JobStatus:
        folder = self.job_dir(spec.submission_id)
        folder.mkdir(parents=True, exist_ok=True)
        command = (
            ["/bin/sh", "-c", spec.entrypoint]
            if isinstance(spec.entrypoint, str)
            else list(spec.entrypoint)
        )
        argv = [sys.executable, "-m", "dressage.launch.supervisor", str(folder / "exit.json")]
        log_path = folder / "job.log"
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    [*argv, "--", *command],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=spec.working_dir or None,
                    env={**os.environ, **spec.env},
                    start_new_session=True,  # own process group: stop() signals the whole job
                )
            except OSError as exc:
                raise LaunchError(
                    f"cannot start job {spec.submission_id} in {spec.working_dir}: {exc}"
                ) from exc
        _CHILDREN[proc.pid] = proc
        found = _proc_stat(proc.pid)
        record = {
            "pid": proc.pid,
            "start_ticks": found[1] if found else -1,
            "started_at": time.time(),
            "entrypoint": command,
            "working_dir": spec.working_dir,
            "env_names": sorted(spec.env),
            "metadata": dict(spec.metadata),
        }
        _write_json(folder / "state.json", record)
        return JobStatus(
            spec.submission_id, JobState.RUNNING, f"started as pid {proc.pid}", log=str(log_path)
        )

    # -- status, logs, stop ------------------------------------------------------------------

    def status(self, submission_id: str) -> JobStatus | None:
        folder = self.job_dir(submission_id)
        try:
            state = json.loads((folder / "state.json").read_text())
        except FileNotFoundError:
            return None
        log = str(folder / "job.log")
        ended = _read_exit(folder)
        if ended is None and _alive(int(state["pid"]), int(state["start_ticks"])):
            return JobStatus(submission_id, JobState.RUNNING, f"pid {state['pid']}", log=log)
        ended = ended or _read_exit(folder)  # it may have ended between the two looks
        if ended is None:
            message = (
                f"process {state['pid']} ended without an exit record "
                "(killed with SIGKILL, or the machine restarted)"
            )
            return JobStatus(submission_id, JobState.FAILED, message, log=log)
        return JobStatus(
            submission_id,
            JobState(ended["state"]),
            str(ended.get("message", "")),
            exit_code=ended.get("exit_code"),
            log=log,
        )

    def logs(self, submission_id: str, *, tail: int | None = None) -> str:
        path = self.job_dir(submission_id) / "job.log"
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            raise LaunchError(f"job {submission_id}: no log at {path}") from None
        return tail_lines(text, tail)

    def stop(self, submission_id: str) -> JobStatus | None:
        """SIGTERM to the job's process group, SIGKILL after the grace period."""
        current = self.status(submission_id)
        if current is None or current.state.terminal:
            return current
        pid = int(json.loads((self.job_dir(submission_id) / "state.json").read_text())["pid"])
        for sig, wait_s in ((signal.SIGTERM, self.stop_grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            if self._wait_terminal(submission_id, wait_s):
                break
        exit_path = self.job_dir(submission_id) / "exit.json"
        if not exit_path.exists():  # SIGKILL left the supervisor no chance to write it
            write_exit(exit_path, {"state": "STOPPED", "exit_code": -9, "message": "killed"})
        return self.status(submission_id)

    def _wait_terminal(self, submission_id: str, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.status(submission_id)
            if found is not None and found.state.terminal:
                return True
            time.sleep(0.1)
        return False


def _read_exit(folder: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((folder / "exit.json").read_text())
    except FileNotFoundError:
        return None
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(scratch, path)


class LocalStatusClient:
    """:class:`LocalLauncher` for triggers: file and /proc reads moved off the event loop."""

    def __init__(self, root: str, *, stop_grace_s: float = 10.0) -> None:
        self._launcher = LocalLauncher(root, stop_grace_s=stop_grace_s)

    async def status(self, submission_id: str) -> JobStatus | None:
        return await asyncio.to_thread(self._launcher.status, submission_id)

    async def read_log(self, submission_id: str, offset: int) -> tuple[str, int]:
        path = self._launcher.job_dir(submission_id) / "job.log"
        return await asyncio.to_thread(_read_complete_lines, path, offset)

    async def stop(self, submission_id: str) -> None:
        await asyncio.to_thread(self._launcher.stop, submission_id)

    async def aclose(self) -> None:
        return None


def _read_complete_lines(path: Path, offset: int) -> tuple[str, int]:
    """Whole lines written after byte ``offset``; a partial last line waits for the next read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return "", offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace"), offset + end
