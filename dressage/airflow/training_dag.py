"""The training DAG's shape, shared by ``dags/dressage_mopd.py`` and ``dags/dressage_rl.py``.

    plan -> prepare -> validate -> start_services (setup) -> prepare_job -> train (deferrable)
         -> stage -> check_segments, check_train_data -> publish (Assets)
    start_services -> stop_services (teardown) <- train

Those 12 edges are the graph the UI draws. ``plan`` reads the DAG's student Asset (an inlet:
the newest published student, for ``continue_from=latest``); ``prepare`` builds the embedded
default's tiny teachers that are not built yet (``tiny-sft:`` specs only; once, cached), so that
``validate``, which never trains, finds them. A task takes its direct upstream's result as its
argument and pulls what it needs from earlier tasks (the plan, the validation report, the
services) from XCom inside the task, so that no edge is drawn for data that only travels
along the chain. Each task is a line that calls :mod:`dressage.airflow.tasks`; a failure that
retries cannot fix is told first in the log and in the run's note (:mod:`dressage.airflow.story`).
The objective, the Assets, the schedule and the tags are what the two DAG files differ in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pendulum
from airflow.sdk import DAG, Asset, Context, dag, setup, task, teardown

from dressage.airflow import story, tasks
from dressage.airflow.assets import STUDENTS
from dressage.airflow.params import training_params
from dressage.airflow.train_operator import TrainJobOperator

__all__ = ["training_dag"]

PROJECT = Path(__file__).resolve().parents[2]


def quiet_task(fn: Any) -> Any:
    """``@task`` whose result (a dict for XCom, not for reading) stays out of its log."""
    return task(show_return_value_in_logs=False)(fn)


def _pull(context: Any, task_id: str) -> Any:
    """An earlier task's result (it ran: every task here is downstream of plan and validate)."""
    return context["ti"].xcom_pull(task_ids=task_id)


def training_dag(
    *,
    dag_id: str,
    objective: str,
    outlets: Sequence[Asset],
    description: str,
    doc_md: str | None,
    schedule: str | None,
    tags: Sequence[str],
) -> DAG:
    """Build the DAG (see the module docstring) for one training objective."""

    # Task arguments are XComArgs when the DAG is built and dicts when the tasks run: Any.
    @task(inlets=[STUDENTS[objective]], show_return_value_in_logs=False)
    def plan(**context: Any) -> Any:
        ctx = cast(Context, context)
        work = lambda: tasks.plan_run(ctx, objective=objective, project_dir=PROJECT)  # noqa: E731
        return story.guard(ctx, work)

    @quiet_task
    def prepare(run: Any, **context: Any) -> Any:
        return story.guard(context, lambda: tasks.prepare_checkpoints(run))

    @quiet_task
    def validate(prepared: Any, **context: Any) -> Any:
        run = _pull(context, "plan")
        return story.guard(context, lambda: tasks.validate_run(run))

    @setup
    @quiet_task
    def start_services(report: Any, **context: Any) -> Any:
        return tasks.start_services(_pull(context, "plan"), report)

    @quiet_task
    def prepare_job(services: Any, **context: Any) -> Any:
        run, report = _pull(context, "plan"), _pull(context, "validate")
        return tasks.prepare_job(run, services, report)

    @quiet_task
    def stage(result: Any, **context: Any) -> Any:
        run, report = _pull(context, "plan"), _pull(context, "validate")
        return story.guard(context, lambda: tasks.stage(run, result, report))

    @quiet_task
    def check_segments(staged: Any, **context: Any) -> Any:
        report = _pull(context, "validate")
        return story.guard(context, lambda: tasks.check_table(staged, "segments", report))

    @quiet_task
    def check_train_data(staged: Any, **context: Any) -> Any:
        report = _pull(context, "validate")
        return story.guard(context, lambda: tasks.check_table(staged, "train_data", report))

    @task(outlets=list(outlets), show_return_value_in_logs=False)
    def publish(segments: Any, train_data: Any, **context: Any) -> Any:
        run, staged = _pull(context, "plan"), _pull(context, "stage")
        return tasks.publish(run, staged, [segments, train_data], cast(Context, context))

    @teardown
    @quiet_task
    def stop_services(services: Any) -> Any:
        return tasks.stop_services(services)

    @dag(
        dag_id=dag_id,
        description=description,
        doc_md=doc_md,
        schedule=schedule,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=list(tags),
        default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=1)},
        params=training_params(objective=objective),
    )
    def pipeline() -> None:
        services = start_services(validate(prepare(plan())))
        train = TrainJobOperator(task_id="train", objective=objective, job=prepare_job(services))
        staged = stage(train.output)
        publish(check_segments(staged), check_train_data(staged))
        train >> stop_services(services)

    built: DAG = pipeline()
    return built
