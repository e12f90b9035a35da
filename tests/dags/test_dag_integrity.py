"""DAG integrity: every DAG file imports cleanly, fast and light, with tags, retries and docs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.airflow import harness

pytestmark = pytest.mark.integration

DAG_FILES = sorted(harness.DAGS.glob("*.py"))
HEAVY = ("torch", "ray", "transformers", "polars", "pandas", "pyarrow", "matplotlib")

# Imports one DAG file the way the DAG processor does, after airflow itself is loaded, and
# reports how long the file took and which heavy modules it pulled in.
_PROBE = """
import importlib.util, json, sys, time
import airflow.sdk
from airflow.sdk.definitions._internal.contextmanager import DagContext
path = sys.argv[1]
DagContext.current_autoregister_module_name = "dag_under_test"
start = time.perf_counter()
spec = importlib.util.spec_from_file_location("dag_under_test", path)
module = importlib.util.module_from_spec(spec)
sys.modules["dag_under_test"] = module
spec.loader.exec_module(module)
elapsed = time.perf_counter() - start
dags = [v.dag_id for v, _ in DagContext.autoregistered_dags]
heavy = [m for m in json.loads(sys.argv[2]) if m in sys.modules]
print(json.dumps({"seconds": elapsed, "heavy": heavy, "dags": dags}))
"""


def _probe(path: Path, **env: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_three_dag_files_one_dag_each() -> None:
    assert [p.stem for p in DAG_FILES] == ["dressage_mopd", "dressage_rl", "dressage_validate"]


def test_dagbag_has_no_import_errors(airflow_db: None) -> None:
    bag = harness.dagbag()
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == [p.stem for p in DAG_FILES]
    for stat in bag.dagbag_stats:
        assert stat.duration.total_seconds() <= 1.0, (stat.file, stat.duration)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.stem)
def test_each_file_parses_fast_without_heavy_imports(path: Path) -> None:
    found = _probe(path)
    assert found["dags"] == [path.stem]
    assert found["heavy"] == [], f"{path.name} imports {found['heavy']} at parse time"
    assert found["seconds"] <= 1.0, f"{path.name} took {found['seconds']:.2f} s to parse"


@pytest.mark.parametrize("dag_id", [p.stem for p in DAG_FILES])
def test_tags_retries_docs_and_params(dag_id: str) -> None:
    dag = harness.dagbag().dags[dag_id]
    assert "dressage" in dag.tags and len(dag.tags) >= 2
    assert dag.doc_md and dag.doc_md.strip().startswith(f"### {dag_id}")
    assert dag.catchup is False
    for task in dag.tasks:
        assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"
    assert "mopd_config" in dag.params and "student" in dag.params


# The README's diagram: data that travels along the chain draws no edge of its own.
TRAINING_UPSTREAM = {
    "plan": set(),
    "prepare": {"plan"},
    "validate": {"prepare"},
    "start_services": {"validate"},
    "prepare_job": {"start_services"},
    "train": {"prepare_job"},
    "stage": {"train"},
    "check_segments": {"stage"},
    "check_train_data": {"stage"},
    "publish": {"check_segments", "check_train_data"},
    "stop_services": {"start_services", "train"},
}


@pytest.mark.parametrize("dag_id", ["dressage_mopd", "dressage_rl"])
def test_training_dags_draw_the_twelve_edges_of_the_readme(dag_id: str) -> None:
    dag = harness.dagbag().dags[dag_id]
    assert len(dag.task_dict) == len(TRAINING_UPSTREAM)
    upstream = {t.task_id: set(t.upstream_task_ids) for t in dag.tasks}
    assert upstream == TRAINING_UPSTREAM
    assert sum(len(u) for u in upstream.values()) == 12
    assert dag.get_task("start_services").is_setup
    assert dag.get_task("stop_services").is_teardown
    assert type(dag.get_task("train")).__name__ == "TrainJobOperator"
    outlets = {a.uri for a in dag.get_task("publish").outlets}
    kind = "mopd" if dag_id == "dressage_mopd" else "rl"
    tables = {f"dressage://{kind}/segments", f"dressage://{kind}/train_data"}
    assert outlets == tables | {f"dressage://{kind}/student"}
    # plan reads the student Asset (continue_from=latest); reading draws no schedule edge
    assert {a.uri for a in dag.get_task("plan").inlets} == {f"dressage://{kind}/student"}


def test_validation_dag_checks_routes_and_checkpoints_in_parallel() -> None:
    dag = harness.dagbag().dags["dressage_validate"]
    assert dag.get_task("load_config").downstream_task_ids == {
        "check_routes",
        "check_checkpoints",
    }
    assert dag.get_task("report").upstream_task_ids == {"check_routes", "check_checkpoints"}


@pytest.mark.parametrize("dag_id", [p.stem for p in DAG_FILES])
def test_docs_name_every_task_and_the_description_every_stage(dag_id: str) -> None:
    dag = harness.dagbag().dags[dag_id]
    for task_id in dag.task_dict:
        assert f"**{task_id}**" in dag.doc_md, f"{dag_id}'s doc does not name {task_id}"
    if dag_id != "dressage_validate":
        stages = ("validate", "serve", "train", "stage", "check", "publish")
        assert all(word in dag.description for word in stages), dag.description
    assert len(dag.description) <= 100  # the DAG list shows it on one line


def test_mopd_is_schedulable_from_the_environment() -> None:
    path = harness.DAGS / "dressage_mopd.py"
    probe = _PROBE.replace("dags = [v.dag_id", "dags = [str(v.schedule) + ' ' + v.dag_id")
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path), "[]"],
        capture_output=True,
        text=True,
        env={**os.environ, "DRESSAGE_MOPD_SCHEDULE": "0 3 * * *"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1])["dags"] == ["0 3 * * * dressage_mopd"]
    assert harness.dagbag().dags["dressage_mopd"].schedule is None
