"""TrainJobOperator: the training DAGs' ``train`` task, a RunJobOperator that tells the outcome.

    train = TrainJobOperator(task_id="train", objective="mopd", job=prepare_job.output)

On success the end of its log is the run's summary (per teacher for MOPD; reward, pass rate per
task and advantages for GRPO; :mod:`dressage.airflow.story`), which is also offered as the
run's note. A job that could not run (exit status 2: its run config is refused), was stopped or
ran out of time fails the task with its one-line verdict first in the log (state, exit code),
then the tail of the job's log, and that verdict in the note. A job that crashed (another exit
status, or killed without one: ``kill -9``, the machine's restart) fails this try only: Airflow
retries the task (``retries`` of the DAG), which submits the job again on the same run folder,
and the job resumes from its last checkpoint (``advanced.save_interval`` steps apart) instead of
starting over.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from dressage.airflow import story
from dressage.airflow.operators import RunJobOperator

__all__ = ["TrainJobOperator"]


REFUSED_EXIT = 2
"""``python -m dressage.jobs.train``'s exit status for a run config that cannot run."""


class TrainJobOperator(RunJobOperator):
    def __init__(self, *, objective: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.objective = objective

    def retryable(self, event: dict[str, Any]) -> bool:
        """A crash (not a refused config): the retried job resumes from its checkpoint."""
        return event.get("state") == "FAILED" and event.get("exit_code") != REFUSED_EXIT

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            result = super().execute(context)
        except AirflowFailException as exc:
            story.fail(context, str(exc))
        return self._told(context, result)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        try:
            result = super().execute_complete(context, event)
        except AirflowFailException as exc:
            story.fail(context, str(exc))
        except AirflowException as exc:  # a crash: the retry resumes from the last checkpoint
            story.log_lines(logging.ERROR, f"{exc}\nthe retry resumes from the last checkpoint")
            raise
        return self._told(context, result)

    def _told(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        report = context["ti"].xcom_pull(task_ids="validate") or {}
        told = story.output_summary(
            Path(result["outputs"]["output_dir"]),
            objective=self.objective,
            teachers=report.get("teachers", []) if self.objective == "mopd" else [],
        )
        story.log_lines(logging.INFO, f"run summary\n{told.text}", wrap=False)
        story.tell(context, told.markdown)
        return result
