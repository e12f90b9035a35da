"""
### dressage_validate: can this config train?

**load_config**: the config parses, types check, paths resolve (a config that does not load
is a problem of the report, not a crash) → in parallel, **check_routes** (each dataset's
teacher exists, weights > 0, agent modes, generate functions and reward modules import, reward
tasks registered, `runtime_env_keys` set, dataset files exist) and **check_checkpoints**
(student and teacher checkpoints present and readable, the same architecture, tokenizer and
vocabulary as the student; a project-built teacher whose recorded agent-loop accuracy on its
own task is below `teacher_skill_floor` is a warning, or a problem with
`require_skilled_teachers`) → **report**: one JSON report of every problem, written to
`<run_root>/dressage_validate/<run_id>/report.json`; the run fails if any, and its note
lists them.

`airflow dags test dressage_validate --conf '{"mopd_config": "configs/mopd/embedded.json"}'`
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, cast

import pendulum
from airflow.sdk import Context, dag, task

from dressage.airflow import story, tasks
from dressage.airflow.params import validation_params

PROJECT = Path(__file__).resolve().parents[1]


@task(show_return_value_in_logs=False)
def load_config(**context: Any) -> dict[str, Any]:
    return tasks.load_validation(cast(Context, context), project_dir=PROJECT)


@task(show_return_value_in_logs=False)
def check_routes(spec: dict[str, Any]) -> dict[str, Any]:
    return tasks.check_routes(spec)


@task(show_return_value_in_logs=False)
def check_checkpoints(spec: dict[str, Any]) -> dict[str, Any]:
    return tasks.check_checkpoints(spec)


@task(show_return_value_in_logs=False)
def report(routes: dict[str, Any], checkpoints: dict[str, Any], **context: Any) -> dict:
    spec = context["ti"].xcom_pull(task_ids="load_config")  # no edge: report needs routes first
    return story.guard(context, lambda: tasks.validation_verdict(spec, routes, checkpoints))


@dag(
    dag_id=Path(__file__).stem,
    description="Check a MOPD config: routes, rewards, checkpoints; fail closed with a report",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["dressage", "validation"],
    default_args={"retries": 1, "retry_delay": dt.timedelta(seconds=30)},
    params=validation_params(),
)
def dressage_validate() -> None:
    spec = load_config()
    report(check_routes(spec), check_checkpoints(spec))


dressage_validate()
