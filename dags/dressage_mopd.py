"""
### dressage_mopd: multi-teacher on-policy distillation, end to end

**validate** the MOPD config and checkpoints (fails closed, listing every problem) →
**start_services**: the embedded engine and the recording proxy (a setup task; on the `ray`
backend they run inside the job) → **prepare_job** writes the job's `run.json` →
**train**: the async MOPD training job, with generation paused around weight updates, awaited
by a deferrable operator (no worker slot while it trains) → **stage** its artifacts to the
artifact root (manifest last, checksums verified) → pandera **checks** of segments and train
data → **publish** the `dressage_mopd_segments` / `dressage_mopd_train_data` Assets.
**stop_services** (teardown) runs whatever happens.

Run it from the trigger form, or `airflow dags test dressage_mopd --conf '{"steps": 8}'`.
Backend `embedded` trains on this machine; `ray` submits the job to the Ray cluster at the
advanced `ray_address`. To schedule it, set `DRESSAGE_MOPD_SCHEDULE` (a cron expression or
preset, e.g. `0 3 * * *`) where the DAG processor runs; scheduled runs take the defaults.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import dag, setup, task, teardown

from dressage.airflow import tasks
from dressage.airflow.assets import MOPD_SEGMENTS, MOPD_TRAIN_DATA
from dressage.airflow.operators import RunJobOperator
from dressage.airflow.params import schedule_from_env, training_params

PROJECT = Path(__file__).resolve().parents[1]
OBJECTIVE = "mopd"


@task
def plan(**context: Any) -> dict[str, Any]:
    return tasks.plan_run(context, objective=OBJECTIVE, project_dir=PROJECT)


@task
def validate(run: dict[str, Any]) -> dict[str, Any]:
    return tasks.validate_run(run)


@setup
@task
def start_services(run: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    return tasks.start_services(run, report)


@task
def prepare_job(run: dict[str, Any], services: dict[str, Any], report: dict[str, Any]) -> dict:
    return tasks.prepare_job(run, services, report)


@task
def stage(run: dict[str, Any], result: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    return tasks.stage(run, result, report)


@task
def check_segments(staged: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    return tasks.check_table(staged, "segments", report)


@task
def check_train_data(staged: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    return tasks.check_table(staged, "train_data", report)


@task(outlets=[MOPD_SEGMENTS, MOPD_TRAIN_DATA])
def publish(run: dict, staged: dict, segments: dict, train_data: dict, **context: Any) -> dict:
    return tasks.publish(run, staged, [segments, train_data], context)


@teardown
@task
def stop_services(services: dict[str, Any]) -> dict[str, str]:
    return tasks.stop_services(services)


@dag(
    dag_id=Path(__file__).stem,
    description="MOPD: validate, serve, train (deferred), stage, check, publish",
    doc_md=__doc__,
    schedule=schedule_from_env(),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["dressage", "mopd", "training"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=1)},
    params=training_params(objective=OBJECTIVE),
)
def dressage_mopd() -> None:
    run = plan()
    report = validate(run)
    services = start_services(run, report)
    train = RunJobOperator(task_id="train", job=prepare_job(run, services, report))
    staged = stage(run, train.output, report)
    publish(run, staged, check_segments(staged, report), check_train_data(staged, report))
    train >> stop_services(services)


dressage_mopd()
