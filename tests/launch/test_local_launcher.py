"""The local launcher: real processes in their own process group, found again by submission id."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dressage.launch.base import JobSpec, JobState, LaunchError, launcher_for, submission_id
from dressage.launch.local import LocalLauncher

pytestmark = pytest.mark.unit

PY = sys.executable


def _wait(launcher: LocalLauncher, sid: str, timeout: float = 30.0) -> JobState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher.status(sid)
        assert status is not None
        if status.state.terminal:
            return status.state
        time.sleep(0.05)
    raise AssertionError(f"{sid} did not end in {timeout} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_success_with_env_working_dir_and_log(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "jobs")
    (tmp_path / "work").mkdir()
    code = "import os; print(os.environ['GREETING'], os.getcwd())"
    spec = JobSpec(
        [PY, "-c", code],
        submission_id="job-ok",
        env={"GREETING": "hello-secret"},
        working_dir=str(tmp_path / "work"),
    )
    started = launcher.submit(spec)
    assert started.state == JobState.RUNNING and not started.reattached
    assert _wait(launcher, "job-ok") == JobState.SUCCEEDED
    status = launcher.status("job-ok")
    assert status is not None and status.exit_code == 0
    assert launcher.logs("job-ok").strip() == f"hello-secret {tmp_path / 'work'}"
    state = json.loads((tmp_path / "jobs/job-ok/state.json").read_text())
    assert state["env_names"] == ["GREETING"] and "hello-secret" not in json.dumps(state)


def test_failure_keeps_exit_code_and_tail(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    code = "import sys\nfor i in range(100): print('line', i)\nsys.exit(7)"
    launcher.submit(JobSpec([PY, "-c", code], submission_id="job-bad"))
    assert _wait(launcher, "job-bad") == JobState.FAILED
    status = launcher.status("job-bad")
    assert status is not None and status.exit_code == 7 and "exit code 7" in status.message
    assert launcher.logs("job-bad", tail=2) == "line 98\nline 99"


def test_shell_entrypoint_and_unstartable_command(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    launcher.submit(JobSpec("echo one && echo two", submission_id="sh"))
    assert _wait(launcher, "sh") == JobState.SUCCEEDED
    assert launcher.logs("sh").split() == ["one", "two"]
    launcher.submit(JobSpec(["/no/such/binary"], submission_id="missing"))
    assert _wait(launcher, "missing") == JobState.FAILED
    assert "cannot start '/no/such/binary'" in launcher.logs("missing")
    with pytest.raises(LaunchError, match="cannot start job nowhere"):
        launcher.submit(JobSpec([PY, "-V"], submission_id="nowhere", working_dir="/no/such/dir"))


def test_submit_again_reattaches_instead_of_starting_twice(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    spec = JobSpec([PY, "-c", "import time; print('once', flush=True); time.sleep(30)"], "job-r")
    first = launcher.submit(spec)
    pid = json.loads((tmp_path / "job-r/state.json").read_text())["pid"]
    again = LocalLauncher(tmp_path).submit(spec)  # a retried task: a new launcher object
    assert again.reattached and again.state == JobState.RUNNING and first.log == again.log
    assert json.loads((tmp_path / "job-r/state.json").read_text())["pid"] == pid
    stopped = launcher.stop("job-r")
    assert stopped is not None and stopped.state == JobState.STOPPED
    assert launcher.logs("job-r").count("once") <= 1
    assert not _alive(pid)


def test_a_finished_job_is_returned_and_a_failed_one_replaced(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    launcher.submit(JobSpec([PY, "-c", "print('done')"], submission_id="j"))
    _wait(launcher, "j")
    again = launcher.submit(JobSpec([PY, "-c", "print('second')"], submission_id="j"))
    assert again.reattached and again.state == JobState.SUCCEEDED
    assert "second" not in launcher.logs("j")

    launcher.submit(JobSpec([PY, "-c", "raise SystemExit(2)"], submission_id="k"))
    _wait(launcher, "k")
    retry = launcher.submit(JobSpec([PY, "-c", "print('retry')"], submission_id="k"))
    assert not retry.reattached
    assert _wait(launcher, "k") == JobState.SUCCEEDED
    archived = json.loads((tmp_path / "k.attempt-1/exit.json").read_text())
    assert archived["state"] == "FAILED" and archived["exit_code"] == 2


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, stop_grace_s=2)
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)"
    )
    launcher.submit(JobSpec([PY, "-c", code], submission_id="tree"))
    deadline = time.monotonic() + 20
    while not launcher.logs("tree").strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(launcher.logs("tree").split()[0])
    assert _alive(grandchild)
    status = launcher.stop("tree")
    assert status is not None and status.state == JobState.STOPPED
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_job_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, stop_grace_s=0.5)
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)"
    )
    launcher.submit(JobSpec([PY, "-c", code], submission_id="stubborn"))
    while "ready" not in launcher.logs("stubborn"):
        time.sleep(0.05)
    status = launcher.stop("stubborn")
    assert status is not None and status.state == JobState.STOPPED


def test_a_vanished_process_is_failed_not_running(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    launcher.submit(JobSpec([PY, "-c", "import time; time.sleep(60)"], submission_id="gone"))
    pid = json.loads((tmp_path / "gone/state.json").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)  # the supervisor gets no chance to write exit.json
    assert _wait(launcher, "gone") == JobState.FAILED
    status = launcher.status("gone")
    assert status is not None and "without an exit record" in status.message


def test_a_recycled_pid_is_not_the_job(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    launcher.submit(JobSpec([PY, "-c", "import time; time.sleep(60)"], submission_id="reuse"))
    state_file = tmp_path / "reuse/state.json"
    state = json.loads(state_file.read_text())
    state["start_ticks"] -= 1  # as if this pid now belonged to a process started earlier
    state_file.write_text(json.dumps(state))
    status = launcher.status("reuse")
    assert status is not None and status.state == JobState.FAILED
    os.killpg(state["pid"], signal.SIGKILL)


def test_unknown_ids_and_launcher_factory(tmp_path: Path) -> None:
    launcher = launcher_for("local", {"root": str(tmp_path)})
    assert launcher.kind == "local" and launcher.status("nope") is None
    assert launcher.stop("nope") is None
    with pytest.raises(LaunchError, match="no log"):
        launcher.logs("nope")
    with pytest.raises(LaunchError, match="unknown launcher 'k8s'"):
        launcher_for("k8s", {})


def test_submission_ids_are_deterministic_safe_and_capped() -> None:
    sid = submission_id("dressage_mopd", "manual__2026-11-30T10:25:13.198844+00:00", "train")
    assert sid == "dressage-dressage_mopd-manual__2026-11-30T10-25-13.198844-00-00-train"
    assert submission_id("d", "r", "t", 3) == "dressage-d-r-t-3"
    assert submission_id("d", "r", "t", part="engine") == "dressage-d-r-t-engine"
    long_a = submission_id("d" * 80, "run-a", "t")
    long_b = submission_id("d" * 80, "run-b", "t")
    assert len(long_a) <= 96 and long_a != long_b
    assert long_a == submission_id("d" * 80, "run-a", "t")
