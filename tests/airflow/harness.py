"""Airflow for tests: a throwaway AIRFLOW_HOME per process, set before airflow is imported.

Every conftest whose tests import airflow calls :func:`configure` at import time and exposes
the session fixture :func:`airflow_db`, which creates the SQLite metadata DB once per
pytest-xdist worker; the home is removed when the process exits. DAGs come from the
repository's ``dags/`` and run with ``dag.test()``.
"""

from __future__ import annotations

import atexit
import copy
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
_PID_KEY = "_DRESSAGE_TEST_AIRFLOW_PID"


def configure() -> Path:
    """Point Airflow at a fresh home for this process (idempotent within one process)."""
    if os.environ.get(_PID_KEY) == str(os.getpid()):
        return Path(os.environ["AIRFLOW_HOME"])
    if "airflow" in sys.modules:
        raise RuntimeError("airflow was imported before the test AIRFLOW_HOME was set")
    home = Path(tempfile.mkdtemp(prefix="dressage-airflow-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ.update(
        {
            _PID_KEY: str(os.getpid()),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        }
    )
    return home


_DB_READY = False


def init_db() -> None:
    global _DB_READY
    if not _DB_READY:
        from airflow.utils import db

        db.initdb()
        _DB_READY = True


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """The metadata DB of this process's AIRFLOW_HOME (a conftest exposes this fixture)."""
    init_db()


_BAG: Any = None


def dagbag() -> Any:
    global _BAG
    if _BAG is None:
        from airflow.dag_processing.dagbag import DagBag

        _BAG = DagBag(str(DAGS))
    return _BAG


def run_dag(dag_id: str, conf: dict[str, Any]) -> Any:
    """One ``dag.test()`` run; returns the DagRun.

    In one process the tasks resolve their Params on the DAG's and the tasks' own Param objects,
    and a run's conf writes its values into them (a worker parses the DAG afresh for each
    task, so only in-process runs share them): the Params are put back after the run, so that
    a run never takes an earlier run's conf for its defaults."""
    dag = dagbag().dags[dag_id]
    saved = copy.deepcopy(dag.params)
    saved_tasks = {task.task_id: copy.deepcopy(task.params) for task in dag.tasks}
    try:
        return dag.test(run_conf=conf)
    finally:
        dag.params = saved
        for task in dag.tasks:
            task.params = saved_tasks[task.task_id]


def states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def xcom(run: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(
            run_id=run.run_id, key="return_value", task_ids=task_id, dag_ids=run.dag_id
        )
        rows = session.scalars(query).all()
        return XComModel.deserialize_value(rows[0]) if rows else None


def all_xcom_text(run: Any) -> str:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id)).all()
        return "\n".join(repr(row.value) for row in rows)


def asset_events(run: Any) -> list[tuple[str, dict[str, Any]]]:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(AssetEvent).where(AssetEvent.source_run_id == run.run_id)
        return [(e.asset.uri, dict(e.extra or {})) for e in session.scalars(query).all()]


def note(run: Any) -> str:
    """The run's note as the UI shows it (empty without one)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.get(DagRun, run.id)
        return str(found.note or "") if found is not None else ""
