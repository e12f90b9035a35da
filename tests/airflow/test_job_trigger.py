"""JobTrigger and RunJobOperator against real local jobs: serialisation, one event per outcome,
deferral with a timeout, reattach on a retried task, log tails on failure, stopping."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    TaskDeferralTimeout,
    TaskDeferred,
)

from dressage.airflow.operators import DEFER_MARGIN_S, RunJobOperator
from dressage.airflow.triggers import JobTrigger
from dressage.launch.base import JobSpec, JobState
from dressage.launch.local import LocalLauncher
from tests.helpers import free_port

pytestmark = pytest.mark.integration

PY = sys.executable


def _events(trigger: JobTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def _trigger(root: Path, sid: str, **kwargs: Any) -> JobTrigger:
    options = LocalLauncher(root).options()
    return JobTrigger(
        launcher="local", launcher_options=options, submission_id=sid, poll_s=0.05, **kwargs
    )


def _start(root: Path, sid: str, code: str) -> LocalLauncher:
    launcher = LocalLauncher(root, stop_grace_s=2)
    launcher.submit(JobSpec([PY, "-c", code], submission_id=sid))
    return launcher


def test_serialize_round_trip_is_json_safe(tmp_path: Path) -> None:
    trigger = _trigger(tmp_path, "sid-1", deadline=123.5, log_offset=7)
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert classpath == "dressage.airflow.triggers.JobTrigger"


def _output(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> str:
    """Airflow logs through structlog (stdout) or logging, depending on what configured it."""
    captured = capfd.readouterr()
    return caplog.text + captured.out + captured.err


def test_success_is_one_event_and_the_log_streams(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("INFO")
    _start(tmp_path, "ok", "import time\nfor i in range(3): print('tick', i, flush=True)")
    events = _events(_trigger(tmp_path, "ok"))
    assert len(events) == 1
    assert events[0]["state"] == "SUCCEEDED" and events[0]["exit_code"] == 0
    assert events[0]["submission_id"] == "ok" and events[0]["log"].endswith("ok/job.log")
    streamed = [line for line in _output(caplog, capfd).splitlines() if "job | tick" in line]
    assert len(streamed) == 3


def test_failure_event_carries_the_exit_code(tmp_path: Path) -> None:
    _start(tmp_path, "bad", "raise SystemExit(3)")
    (event,) = _events(_trigger(tmp_path, "bad"))
    assert event["state"] == "FAILED" and event["exit_code"] == 3


def test_deadline_gives_a_timeout_event_and_leaves_stopping_to_the_operator(
    tmp_path: Path,
) -> None:
    launcher = _start(tmp_path, "slow", "import time; time.sleep(60)")
    started = time.monotonic()
    (event,) = _events(_trigger(tmp_path, "slow", deadline=time.time() + 0.5))
    assert event["state"] == "TIMEOUT" and time.monotonic() - started < 10
    assert launcher.status("slow").state == JobState.RUNNING  # type: ignore[union-attr]
    launcher.stop("slow")


def test_unknown_job_and_unreachable_status_give_error_events(tmp_path: Path) -> None:
    (missing,) = _events(_trigger(tmp_path, "never-submitted"))
    assert missing["state"] == "ERROR" and "does not exist" in missing["message"]
    trigger = JobTrigger(
        launcher="ray",
        launcher_options={"address": f"http://127.0.0.1:{free_port()}", "timeout_s": 2},
        submission_id="x",
        poll_s=0.01,
        max_poll_failures=2,
    )
    (lost,) = _events(trigger)
    assert lost["state"] == "ERROR" and "unreachable" in lost["message"]


def test_trigger_on_kill_stops_the_job(tmp_path: Path) -> None:
    launcher = _start(tmp_path, "killme", "import time; time.sleep(60)")
    asyncio.run(_trigger(tmp_path, "killme").on_kill())
    assert launcher.status("killme").state == JobState.STOPPED  # type: ignore[union-attr]


# -- the operator ----------------------------------------------------------------------------


def _context(task_id: str = "train") -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="dag", run_id="manual__1", task_id=task_id, map_index=-1)
    return {"ti": ti}


def _operator(tmp_path: Path, code: str, **request: Any) -> RunJobOperator:
    job = {
        "launcher": "local",
        "launcher_options": {"root": str(tmp_path / "jobs"), "stop_grace_s": 2},
        "entrypoint": [PY, "-c", code],
        "poll_s": 0.05,
        "outputs": {"output_dir": str(tmp_path / "out")},
        **request,
    }
    return RunJobOperator(task_id="train", job=job)


def _defer(operator: RunJobOperator, context: dict[str, Any]) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)  # type: ignore[arg-type]
    return deferred.value


def test_operator_defers_with_a_timeout_and_completes(tmp_path: Path) -> None:
    operator = _operator(tmp_path, "print('trained')", timeout_s=600)
    deferred = _defer(operator, _context())
    trigger = deferred.trigger
    assert isinstance(trigger, JobTrigger)
    assert trigger.submission_id == "dressage-dag-manual__1-train"
    assert deferred.method_name == "execute_complete"
    assert deferred.timeout is not None
    assert deferred.timeout.total_seconds() == 600 + DEFER_MARGIN_S
    assert trigger.deadline is not None and abs(trigger.deadline - (time.time() + 600)) < 30
    (event,) = _events(trigger)
    result = operator.execute_complete(_context(), event)  # type: ignore[arg-type]
    assert result["state"] == "SUCCEEDED"
    assert result["outputs"] == {"output_dir": str(tmp_path / "out")}


def test_a_retried_task_reattaches_to_its_running_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("INFO")
    code = "import time; print('started', flush=True); time.sleep(60)"
    first = _defer(_operator(tmp_path, code), _context())
    sid = first.trigger.submission_id  # type: ignore[attr-defined]
    state_file = tmp_path / "jobs" / sid / "state.json"
    pid = json.loads(state_file.read_text())["pid"]
    retried = _operator(tmp_path, code)  # a new attempt: a fresh operator instance
    _defer(retried, _context())
    assert json.loads(state_file.read_text())["pid"] == pid
    assert f"reattached to job {sid}" in _output(caplog, capfd)
    retried.on_kill()
    assert LocalLauncher(tmp_path / "jobs").status(sid).state == JobState.STOPPED  # type: ignore[union-attr]


def test_a_retry_after_success_returns_without_running_again(tmp_path: Path) -> None:
    operator = _operator(tmp_path, "print('ran')")
    (event,) = _events(_defer(operator, _context()).trigger)  # type: ignore[arg-type]
    assert event["state"] == "SUCCEEDED"
    result = _operator(tmp_path, "print('ran')").execute(_context())  # type: ignore[arg-type]
    assert result["state"] == "SUCCEEDED"
    assert LocalLauncher(tmp_path / "jobs").logs(event["submission_id"]).count("ran") == 1


def test_a_failed_job_fails_the_task_with_its_log_tail(tmp_path: Path) -> None:
    code = "for i in range(60): print('step', i)\nraise SystemExit('diverged at step 59')"
    operator = _operator(tmp_path, code)
    (event,) = _events(_defer(operator, _context()).trigger)  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException) as failure:
        operator.execute_complete(_context(), event)  # type: ignore[arg-type]
    message = str(failure.value)
    assert "job dressage-dag-manual__1-train FAILED: exit code 1\n" in message
    assert "--- last 40 lines of its log" in message
    assert "diverged at step 59" in message and "step 58" in message and "step 10\n" not in message


def test_timeout_stops_the_job_and_lost_track_is_retryable(tmp_path: Path) -> None:
    operator = _operator(tmp_path, "import time; time.sleep(60)", timeout_s=0.5)
    trigger = _defer(operator, _context()).trigger
    (event,) = _events(trigger)  # type: ignore[arg-type]
    assert event["state"] == "TIMEOUT"
    with pytest.raises(AirflowFailException, match="ran longer than 0 s and was stopped"):
        operator.execute_complete(_context(), event)  # type: ignore[arg-type]
    sid = event["submission_id"]
    assert LocalLauncher(tmp_path / "jobs").status(sid).state == JobState.STOPPED  # type: ignore[union-attr]
    lost = {"submission_id": sid, "state": "ERROR", "message": "5 status polls failed"}
    with pytest.raises(AirflowException, match="lost track of job") as error:
        operator.execute_complete(_context(), lost)  # type: ignore[arg-type]
    assert not isinstance(error.value, AirflowFailException)


def test_a_deferral_timeout_stops_the_job(tmp_path: Path) -> None:
    operator = _operator(tmp_path, "import time; time.sleep(60)")
    sid = _defer(operator, _context()).trigger.submission_id  # type: ignore[attr-defined]
    with pytest.raises(TaskDeferralTimeout):
        operator.resume_execution(
            "__fail__",
            {"error": "Trigger timeout"},
            _context(),  # type: ignore[arg-type]
        )
    assert LocalLauncher(tmp_path / "jobs").status(sid).state == JobState.STOPPED  # type: ignore[union-attr]


def test_an_unreachable_ray_address_fails_naming_it() -> None:
    address = f"http://127.0.0.1:{free_port()}"
    operator = RunJobOperator(
        task_id="train",
        job={"launcher": "ray", "launcher_options": {"address": address}, "entrypoint": "true"},
    )
    with pytest.raises(AirflowException, match=f"the Ray dashboard at {address} is unreachable"):
        operator.execute(_context())  # type: ignore[arg-type]


# -- crashes and restarts (issue 28): the run goes on, or the retry resumes it -----------------


def test_a_triggerer_restart_leaves_the_job_running_and_a_new_trigger_sees_it_end(
    tmp_path: Path,
) -> None:
    """A triggerer shutting down cancels its triggers (no ``on_kill``: that is for a user's
    action); the new triggerer rebuilds each from ``serialize()`` and polls the same job."""
    root = tmp_path / "jobs"
    launcher = _start(
        root, "long", "import time\nfor i in range(40): print(i, flush=True); time.sleep(0.05)"
    )
    trigger = _trigger(root, "long", deadline=time.time() + 120)

    async def cancelled_midway() -> None:
        task = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.5)
        task.cancel()  # what the triggerer's shutdown does to a running trigger
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_midway())
    assert launcher.status("long").state == JobState.RUNNING  # type: ignore[union-attr]
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    (event,) = _events(rebuilt)
    assert event["state"] == "SUCCEEDED" and event["exit_code"] == 0


def _train_context() -> dict[str, Any]:
    """The train task's context: its ti also takes the note (story.tell) as an XCom."""
    context = _context()
    context["ti"].xcom_push = lambda key, value: None
    return context


def _train_operator(tmp_path: Path, code: str) -> Any:
    from dressage.airflow.train_operator import TrainJobOperator

    job = _operator(tmp_path, code).job
    return TrainJobOperator(task_id="train", objective="mopd", job=job)


def test_a_crashed_training_job_is_retried_and_a_refused_one_is_not(tmp_path: Path) -> None:
    """A crash (killed with SIGKILL: no exit status; or an exit status other than 2) raises a
    retryable error: the retry submits the job again and it resumes from its checkpoint. Exit
    status 2 (the job refused its run config) fails the task for good."""
    import os
    import signal

    code = "import time; print('step 1/9 x', flush=True); time.sleep(60)"
    operator = _train_operator(tmp_path, code)
    trigger = _defer(operator, _context()).trigger
    sid = trigger.submission_id  # type: ignore[attr-defined]
    pid = json.loads((tmp_path / "jobs" / sid / "state.json").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)  # the job and its supervisor: no exit record
    (event,) = _events(trigger)  # type: ignore[arg-type]
    assert event["state"] == "FAILED" and event["exit_code"] is None
    with pytest.raises(AirflowException, match="without an exit record") as crash:
        operator.execute_complete(_train_context(), event)
    assert not isinstance(crash.value, AirflowFailException)
    retried = _train_operator(tmp_path, "print('resumed')")  # a new attempt of the same job
    (event,) = _events(_defer(retried, _context()).trigger)  # type: ignore[arg-type]
    assert event["state"] == "SUCCEEDED" and (tmp_path / "jobs" / f"{sid}.attempt-1").is_dir()

    for exit_code, final in ((1, False), (2, True)):
        operator = _train_operator(tmp_path / str(exit_code), f"raise SystemExit({exit_code})")
        (event,) = _events(_defer(operator, _context()).trigger)  # type: ignore[arg-type]
        with pytest.raises(AirflowException) as failed:
            operator.execute_complete(_train_context(), event)
        assert isinstance(failed.value, AirflowFailException) is final, exit_code
