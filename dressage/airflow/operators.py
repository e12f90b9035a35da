"""RunJobOperator: launch a job through the launcher port and wait for it without a worker slot.

    train = RunJobOperator(task_id="train", job=prepare_job(plan, services))

``job`` is a :class:`dressage.launch.request.JobRequest` as a dict (usually an upstream XCom).
``execute`` submits it under the deterministic id ``dressage-<dag>-<run>-<task>[-<map>]``: a
retried task (a crashed worker, a restarted scheduler) finds its job running and reattaches
instead of starting a second one. It then defers to :class:`~dressage.airflow.triggers.JobTrigger`
with a ``timeout`` (the job's own timeout plus a margin: the trigger reports TIMEOUT first).

``execute_complete`` returns ``{"submission_id", "state", "log", "outputs"}`` on success. A job
that failed, was stopped or ran out of time fails the task without retries (running the same job
again would fail the same way; clear the task to try again), with the last lines of the job's log
in the error, unless :meth:`RunJobOperator.retryable` says a retry can do better (the training
job's crash: a retry submits it again and it resumes from its last checkpoint). Losing track of
the job (status unreadable) raises a retryable error. ``on_kill``, the trigger's ``on_kill`` and
a deferral timeout all stop the job.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from dressage.airflow.triggers import JobTrigger
from dressage.launch.base import JobState, Launcher, LaunchError, launcher_for, submission_id
from dressage.launch.request import JobRequest

__all__ = ["RunJobOperator"]

LOG_TAIL_LINES = 40
DEFER_MARGIN_S = 300.0
_FAIL_NEXT_METHOD = "__fail__"


class RunJobOperator(BaseOperator):
    template_fields: Sequence[str] = ("job",)
    ui_color = "#e8f0e0"

    def __init__(
        self, *, job: dict[str, Any] | Any, stream_logs: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.stream_logs = stream_logs
        self._launched: tuple[Launcher, str] | None = None

    def _request(self) -> JobRequest:
        return JobRequest.model_validate(self.job)

    @staticmethod
    def _submission_id(context: Context) -> str:
        ti = context["ti"]
        map_index = ti.map_index if ti.map_index is not None else -1
        return submission_id(ti.dag_id, ti.run_id, ti.task_id, map_index)

    def execute(self, context: Context) -> dict[str, Any]:
        request = self._request()
        sid = self._submission_id(context)
        launcher = launcher_for(request.launcher, request.launcher_options)
        try:
            status = launcher.submit(request.spec(sid, os.environ))
        except LaunchError as exc:
            raise AirflowException(f"cannot launch job {sid}: {exc}") from exc
        self._launched = (launcher, sid)
        verb = "reattached to" if status.reattached else "submitted"
        self.log.info("%s job %s (%s); log: %s", verb, sid, status.state.value, status.log)
        if status.state == JobState.SUCCEEDED:
            return self._result(request, sid, status.state.value, status.log)
        trigger = JobTrigger(
            launcher=request.launcher,
            launcher_options=launcher.options(),
            submission_id=sid,
            poll_s=request.poll_s,
            deadline=time.time() + request.timeout_s,
            stream_logs=self.stream_logs,
        )
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=dt.timedelta(seconds=request.timeout_s + DEFER_MARGIN_S),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger's one event (the payload carries the submission id)."""
        request = self._request()
        submission_id = str(event.get("submission_id") or self._submission_id(context))
        state, message = str(event.get("state")), str(event.get("message") or "")
        if state == JobState.SUCCEEDED.value:
            self.log.info("job %s succeeded", submission_id)
            return self._result(request, submission_id, state, str(event.get("log", "")))
        launcher = launcher_for(request.launcher, request.launcher_options)
        if state == "ERROR":
            raise AirflowException(f"lost track of job {submission_id}: {message}")
        if state == "TIMEOUT":
            launcher.stop(submission_id)
            message = f"ran longer than {request.timeout_s:.0f} s and was stopped"
        failure = self._failure(launcher, submission_id, state, message, event)
        if self.retryable(event):
            raise AirflowException(failure)
        raise AirflowFailException(failure)

    def retryable(self, event: dict[str, Any]) -> bool:
        """Whether a retry of the task (the same job, submitted again) can end otherwise than
        this attempt did; not for a generic job."""
        return False

    @staticmethod
    def _failure(
        launcher: Launcher, sid: str, state: str, message: str, event: dict[str, Any]
    ) -> str:
        try:
            tail = launcher.logs(sid, tail=LOG_TAIL_LINES)
        except LaunchError as exc:
            tail = f"(log unavailable: {exc})"
        code = event.get("exit_code")
        where = event.get("log") or "?"
        head = f"job {sid} {state}: {message}"
        if code is not None and f"exit code {code}" not in message:
            head += f" (exit code {code})"
        return f"{head}\n--- last {LOG_TAIL_LINES} lines of its log ({where}) ---\n{tail}"

    @staticmethod
    def _result(request: JobRequest, sid: str, state: str, log: str) -> dict[str, Any]:
        return {"submission_id": sid, "state": state, "log": log, "outputs": dict(request.outputs)}

    def on_kill(self) -> None:
        if self._launched is not None:
            launcher, sid = self._launched
            self.log.info("stopping job %s", sid)
            launcher.stop(sid)

    def resume_execution(
        self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context
    ) -> Any:
        if next_method == _FAIL_NEXT_METHOD:  # the deferral timed out or the trigger crashed
            request = self._request()
            sid = self._submission_id(context)
            try:
                launcher_for(request.launcher, request.launcher_options).stop(sid)
                self.log.error("stopped job %s after its trigger failed or timed out", sid)
            except LaunchError as exc:
                self.log.error("could not stop job %s: %s", sid, exc)
        return super().resume_execution(next_method, next_kwargs, context)
