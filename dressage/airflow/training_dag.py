"""The training DAG's shape, shared by ``dags/dressage_mopd.py`` and ``dags/dressage_rl.py``.

    plan -> validate -> start_services (setup) -> prepare_job -> train (deferrable)
         -> stage -> check_segments, check_train_data -> publish (Assets)
    train >> stop_services (teardown)

Each task is a line that calls :mod:`dressage.airflow.tasks`; the objective, the Assets, the
schedule and the tags are what the two DAG files differ in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pendulum
from airflow.sdk import DAG, Asset, Context, dag, setup, task, teardown

from dressage.airflow import tasks
from dressage.airflow.operators import RunJobOperator
from dressage.airflow.params import training_params

__all__ = ["training_dag"]

PROJECT = Path(__file__).resolve().parents[2]


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
    @task
    def plan(**context: Any) -> Any:
        return tasks.plan_run(cast(Context, context), objective=objective, project_dir=PROJECT)

    @task
    def validate(run: Any) -> Any:
        return tasks.validate_run(run)

    @setup
    @task
    def start_services(run: Any, report: Any) -> Any:
        return tasks.start_services(run, report)

    @task
    def prepare_job(run: Any, services: Any, report: Any) -> Any:
        return tasks.prepare_job(run, services, report)

    @task
    def stage(run: Any, result: Any, report: Any) -> Any:
        return tasks.stage(run, result, report)

    @task
    def check_segments(staged: Any, report: Any) -> Any:
        return tasks.check_table(staged, "segments", report)

    @task
    def check_train_data(staged: Any, report: Any) -> Any:
        return tasks.check_table(staged, "train_data", report)

    @task(outlets=list(outlets))
    def publish(run: Any, staged: Any, segments: Any, train_data: Any, **context: Any) -> Any:
        return tasks.publish(run, staged, [segments, train_data], cast(Context, context))

    @teardown
    @task
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
        run = plan()
        report = validate(run)
        services = start_services(run, report)
        train = RunJobOperator(task_id="train", job=prepare_job(run, services, report))
        staged = stage(run, train.output, report)
        publish(run, staged, check_segments(staged, report), check_train_data(staged, report))
        train >> stop_services(services)

    built: DAG = pipeline()
    return built
