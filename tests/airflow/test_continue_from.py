"""Scheduled runs that continue: ``continue_from`` on the training DAGs.

Two runs of ``dressage_mopd`` in a row through ``dag.test()`` with the real training job
(``python -m dressage.jobs.train``) on the tiny test models: the first fresh, the second
``latest``. The second starts from the student the first published (its Asset event's checkpoint)
and from its data position: its accuracy before training is the first run's after, and its
first prompts are those the first run had handed out but not trained, then the next ones. The
plan's resolution (empty: ``latest`` when scheduled, ``fresh`` when triggered) and a checkpoint
that does not exist are checked without a job.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from dressage.airflow.plan import RunPlan
from dressage.airflow.tasks import continue_from
from dressage.reporting.metrics import HELDOUT_KL_PREFIX
from tests.airflow import harness
from tests.helpers import REPO

pytestmark = pytest.mark.integration

DATA = REPO / "configs" / "mopd" / "data"
TASKS = ("calculator", "lookup")


def _config(root: Path, eval_rows: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    datasets = []
    for task in TASKS:
        held_out = root / f"{task}.eval.jsonl"
        held_out.write_text(
            "".join((DATA / f"{task}.eval.jsonl").read_text().splitlines(True)[:eval_rows])
        )
        datasets.append({"name": task, "path": str(DATA / f"{task}.jsonl"), "teacher_id": task,
                         "weight": 1.0, "agent_mode": "blackbox", "task": task,
                         "eval_path": str(held_out)})  # fmt: skip
    config = {
        "student": {"hf_checkpoint": "tiny:seed=0"},
        "teachers": {"calculator": {"load": "tiny:seed=1"}, "lookup": {"load": "tiny:seed=2"}},
        "datasets": datasets,
        "reward_modules": ["dressage.reward.builtin"],
    }
    path = root / "mopd.json"
    path.write_text(json.dumps(config))
    return path


def _conf(tmp_path: Path, **params: Any) -> dict[str, Any]:
    return {
        "mopd_config": str(_config(tmp_path / "config")),
        "steps": 2,
        "rollout_batch_size": 2,
        "run_root": str(tmp_path / "runs"),
        "artifact_root": str(tmp_path / "artifacts"),
        "poll_seconds": 0.5,
        "extra": {
            "learning_rate": 1e-2,  # a visible step: the two runs' students differ
            "max_response_len": 24,
            "agent_max_turns": 2,
            "groups_in_flight": 3,
            "device": "cpu",
            "eval_interval": 2,  # held-out accuracy before and after the run only
            # near-greedy: the probe's held-out contexts (sampled once, by the config's
            # student, at each run's start) are the same in both runs, so its exact KL is
            # comparable across them
            "temperature": 1e-3,
        },
        **params,
    }


def _summary(run: Any) -> dict[str, Any]:
    plan = harness.xcom(run, "plan")
    return json.loads((Path(plan["run_dir"]) / "output" / "summary.json").read_text())


def _first_prompts(run: Any) -> list[str]:
    """The prompts of the run's first rollout, in the order its samples were recorded."""
    from dressage.staging import open_artifact

    plan = harness.xcom(run, "plan")
    url = (Path(plan["run_dir"]) / "output" / "artifacts" / "rollout-00000").resolve().as_uri()
    table = open_artifact(url).read_table("samples")
    return sorted(json.dumps(json.loads(p)) for p in table.column("prompt_json").to_pylist())


def test_a_second_run_continues_the_student_and_the_data_the_first_published(
    airflow_db: None, note_listener: None, tmp_path: Path
) -> None:
    first = harness.run_dag("dressage_mopd", _conf(tmp_path, continue_from="fresh"))
    assert first.state == "success", harness.states(first)
    events = dict(harness.asset_events(first))
    student = events["dressage://mopd/student"]
    assert student["checkpoint"].startswith("file://") and student["checkpoint"].endswith(
        "/output/checkpoints/iter_0000001"
    )
    assert student["steps"] == 2 and student["parent_run"] is None
    assert set(student["accuracy"]) == set(TASKS) and student["run_id"] == first.run_id
    assert "Started from: the config's student, fresh" in harness.note(first)
    first_summary = _summary(first)
    assert first_summary["started_from"] == {"kind": "fresh"}

    second = harness.run_dag("dressage_mopd", _conf(tmp_path, continue_from="latest"))
    assert second.state == "success", harness.states(second)
    plan = harness.xcom(second, "plan")
    checkpoint = Path(student["checkpoint"].removeprefix("file://"))
    assert plan["continue_from"] == str(checkpoint) and plan["parent_run"] == first.run_id
    summary = _summary(second)
    started = summary["started_from"]
    assert started["kind"] == "continued" and started["checkpoint"] == str(checkpoint)
    # the student before training is the one the first run trained: the same accuracy
    before = summary["heldout_accuracy_initial"]
    assert {task: before[f"eval/accuracy/{task}"] for task in TASKS} == student["accuracy"]
    # and the exact held-out reverse KL to each teacher (the accuracy of these untrained tiny
    # models is 0% either way): the first run's after its last step, the second's before
    after = first_summary["final_metrics"]
    moved = first_summary["heldout_reverse_kl_initial"]["all"] - after[f"{HELDOUT_KL_PREFIX}all"]
    assert abs(moved) > 1e-6 * after[f"{HELDOUT_KL_PREFIX}all"]  # training moved it: it tells
    assert summary["heldout_reverse_kl_initial"] == {
        teacher: pytest.approx(after[f"{HELDOUT_KL_PREFIX}{teacher}"], rel=1e-6)
        for teacher in summary["heldout_reverse_kl_initial"]
    }
    assert set(summary["heldout_reverse_kl_initial"]) >= set(TASKS)
    # the data position continues the first run's: its saved position, then its carried groups
    saved = json.loads((checkpoint / "rollout.json").read_text())
    assert started["data_position"] == saved["data_source"]
    assert started["data_position"]["sample_index"] > 0  # not the first prompt again
    assert started["carried_groups"] == len(saved["groups"])
    carried = {json.dumps(group[0]["prompt"]) for group in saved["groups"]}
    if carried:  # groups the first run handed out but did not train come first
        assert carried & set(_first_prompts(second))
    assert _first_prompts(second) != _first_prompts(first)
    note = harness.note(second)
    assert f"Started from: `{checkpoint}`, published by run {first.run_id}" in note
    assert dict(harness.asset_events(second))["dressage://mopd/student"]["parent_run"] == (
        first.run_id
    )


def _context(params: dict[str, Any], run_type: str, events: list[Any]) -> Any:
    from dressage.airflow.assets import MOPD_STUDENT

    return {
        "params": params,
        "dag_run": SimpleNamespace(run_type=run_type),
        "inlet_events": {MOPD_STUDENT: events},
    }


def _plan(tmp_path: Path) -> RunPlan:
    return RunPlan(
        dag_id="dressage_mopd", run_id="r2", run_slug="r2", objective="mopd",
        backend="embedded", mopd_config="c.json", student=None, artifact_url="file:///a",
        run_dir=str(tmp_path / "run"), steps=1, seed=0, rollout_batch_size=1,
        partial_rollout=True, ray_address="", ray_python="", job_timeout_s=60, poll_s=1,
    )  # fmt: skip


def _checkpoint(root: Path) -> Path:
    """A complete embedded checkpoint folder (what the plan checks: layout and sizes)."""
    folder = root / "checkpoints" / "iter_0000003"
    folder.mkdir(parents=True)
    (folder / "trainer.pt").write_bytes(b"x" * 5)
    (folder / "checkpoint.json").write_text(json.dumps({"files": {"trainer.pt": 5}}))
    (root / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3\n")
    return folder


@pytest.mark.parametrize(
    ("run_type", "expected"), [("scheduled", "latest"), ("manual", "fresh"), ("backfill", "fresh")]
)
def test_an_empty_continue_from_is_latest_when_scheduled(
    tmp_path: Path, run_type: str, expected: str
) -> None:
    folder = _checkpoint(tmp_path / "earlier")
    event = SimpleNamespace(
        extra={"checkpoint": folder.as_uri(), "dag_id": "dressage_mopd", "run_id": "r1"}
    )
    other = SimpleNamespace(extra={"checkpoint": None, "dag_id": "dressage_mopd", "run_id": "r0"})
    got = continue_from(_context({}, run_type, [event, other]), _plan(tmp_path), tmp_path)
    if expected == "latest":  # the newest event with a checkpoint, not the newest event
        assert got == {"continue_from": str(folder), "continue_mode": "latest", "parent_run": "r1"}
    else:
        assert got == {"continue_from": None, "continue_mode": "fresh", "parent_run": None}


def test_latest_with_nothing_published_starts_fresh(tmp_path: Path) -> None:
    got = continue_from(
        _context({"continue_from": "latest"}, "manual", []), _plan(tmp_path), tmp_path
    )
    assert got["continue_from"] is None and got["continue_mode"] == "fresh"


def test_a_named_checkpoint_folder_or_url_resolves_to_its_newest(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "earlier")
    for value in ("earlier/checkpoints", (tmp_path / "earlier" / "checkpoints").as_uri()):
        got = continue_from(
            _context({"continue_from": value}, "manual", []), _plan(tmp_path), tmp_path
        )
        assert got == {
            "continue_from": str(folder),
            "continue_mode": "checkpoint",
            "parent_run": None,
        }


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("nowhere/checkpoints", "does not exist; name a run's output/checkpoints folder"),
        ("empty", "holds no checkpoint"),
        ("s3://bucket/ckpt", "only a folder or a file:// URL can be continued from, not s3://"),
    ],
)
def test_a_checkpoint_that_is_not_there_fails_the_plan_in_one_sentence(
    tmp_path: Path, value: str, needle: str
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(AirflowFailException, match="Continue from") as failed:
        continue_from(_context({"continue_from": value}, "manual", []), _plan(tmp_path), tmp_path)
    assert needle in str(failed.value) and "\n" not in str(failed.value)


def _slime_checkpoint(root: Path, iteration: int = 4, *, data: bool = True) -> Path:
    """A slime run's checkpoint folder as the plan reads it: Megatron's tracker and iteration
    folder, and the data source's position saved with it."""
    folder = root / "checkpoints" / f"iter_{iteration:07d}"
    folder.mkdir(parents=True)
    (root / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    if data:
        state = root / "checkpoints" / "rollout" / f"dressage_data_source_{iteration}.json"
        state.parent.mkdir()
        state.write_text("{}")
    return folder


def test_the_ray_backend_continues_a_slime_runs_checkpoint(tmp_path: Path) -> None:
    """On the ray backend ``continue_from`` names a slime run's Megatron checkpoint; an empty
    value of a scheduled run is its latest published one, as on the embedded backend."""
    plan = _plan(tmp_path).model_copy(update={"backend": "ray"})
    folder = _slime_checkpoint(tmp_path / "earlier")
    got = continue_from(
        _context({"continue_from": "earlier/checkpoints"}, "manual", []), plan, tmp_path
    )
    assert got == {"continue_from": str(folder), "continue_mode": "checkpoint", "parent_run": None}
    event = SimpleNamespace(
        extra={"checkpoint": folder.as_uri(), "dag_id": "dressage_mopd", "run_id": "r1"}
    )
    got = continue_from(_context({}, "scheduled", [event]), plan, tmp_path)
    assert got == {"continue_from": str(folder), "continue_mode": "latest", "parent_run": "r1"}
    # an embedded checkpoint has Megatron's layout but not a slime run's data position
    _checkpoint(tmp_path / "embedded")
    with pytest.raises(AirflowFailException, match="has no data position"):
        continue_from(
            _context({"continue_from": "embedded/checkpoints/iter_0000003"}, "manual", []),
            plan,
            tmp_path,
        )


def test_a_slime_checkpoint_without_its_data_position_fails_the_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path).model_copy(update={"backend": "ray"})
    folder = _slime_checkpoint(tmp_path / "earlier", data=False)
    with pytest.raises(AirflowFailException) as failed:
        continue_from(_context({"continue_from": str(folder.parent)}, "manual", []), plan, tmp_path)
    message = str(failed.value)
    assert "has no data position" in message and "dressage_data_source_4.json" in message
    assert "\n" not in message
