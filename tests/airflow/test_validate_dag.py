"""dressage_validate through dag.test(): the embedded config passes; broken configs fail closed
with a JSON report that names every culprit (teacher, dataset, reward module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.airflow import harness

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("embedded_checkpoints")]

EMBEDDED = harness.REPO / "configs/mopd/embedded.json"


def _config(tmp_path: Path, **changes: Any) -> Path:
    data = json.loads(EMBEDDED.read_text())
    for ds in data["datasets"]:
        ds["path"] = str(EMBEDDED.parent / ds["path"])
        ds["eval_path"] = str(EMBEDDED.parent / ds["eval_path"])
    data.update(changes)
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(data))
    return path


def _run(tmp_path: Path, config: Path | str) -> tuple[Any, dict[str, Any]]:
    run = harness.run_dag(
        "dressage_validate", {"mopd_config": str(config), "run_root": str(tmp_path / "runs")}
    )
    reports = list((tmp_path / "runs" / "dressage_validate").glob("*/report.json"))
    assert len(reports) == 1
    return run, json.loads(reports[0].read_text())


def test_embedded_config_passes(airflow_db: None, tmp_path: Path) -> None:
    run, report = _run(tmp_path, EMBEDDED)
    assert run.state == "success", harness.states(run)
    assert report["ok"] and report["problems"] == []
    assert report["vocab_size"] == 704  # the task vocabulary (690 tokens), padded to 64
    assert harness.xcom(run, "report")["ok"] is True


def test_mismatched_and_missing_checkpoints_and_modules_are_all_reported(
    airflow_db: None, tmp_path: Path
) -> None:
    config = _config(
        tmp_path,
        teachers={
            "calculator": {"load": "tiny:seed=1,hidden_size=32"},  # another architecture
            "lookup": {"load": str(tmp_path / "no-such-checkpoint")},
        },
        reward_modules=["dressage.reward.builtin", "no_such_reward_module"],
    )
    run, report = _run(tmp_path, config)
    assert run.state == "failed"
    states = harness.states(run)
    assert states["load_config"] == "success" and states["report"] == "failed"
    by_subject: dict[str, str] = {}
    for problem in report["problems"]:
        by_subject[problem["subject"]] = by_subject.get(problem["subject"], "") + problem["message"]
    assert "hidden_size 32 != student's 128" in by_subject["teacher 'calculator'"]
    assert "tensors differ from the student's" in by_subject["teacher 'calculator'"]
    assert "does not exist" in by_subject["teacher 'lookup'"]
    assert (
        "No module named 'no_such_reward_module'"
        in by_subject["reward module 'no_such_reward_module'"]
    )
    assert report["ok"] is False


def test_a_dataset_without_its_teacher_is_reported_by_the_report_task(
    airflow_db: None, tmp_path: Path
) -> None:
    data = json.loads(EMBEDDED.read_text())
    data["datasets"][1]["teacher_id"] = "retrieval"  # no such teacher
    data["datasets"][0]["weight"] = 0
    config = _config(tmp_path, datasets=data["datasets"])
    run, report = _run(tmp_path, config)
    assert run.state == "failed"
    states = harness.states(run)
    assert states["load_config"] == states["check_routes"] == "success"
    assert states["report"] == "failed"
    messages = {p["subject"]: p["message"] for p in report["problems"]}
    assert "teacher_id 'retrieval' is not a teacher" in messages["dataset 'lookup'"]
    assert "weight must be > 0" in messages["dataset 'calculator'"]


def test_unskilled_teachers_warn_and_fail_when_skill_is_required(
    airflow_db: None, tmp_path: Path
) -> None:
    # both teachers are the config's own student: built by the project, so its
    # sft_report.json records its agent-loop accuracy, and it is far below the 0.9 floor
    embedded = json.loads(EMBEDDED.read_text())
    student = embedded["student"]["hf_checkpoint"]
    for teacher in embedded["teachers"].values():
        teacher["load"] = student
    config = _config(tmp_path, teachers=embedded["teachers"])
    teachers = embedded["teachers"]
    conf = {"mopd_config": str(config), "teacher_skill_floor": 0.9}
    for required, state in ((False, "success"), (True, "failed")):
        root = tmp_path / f"required-{required}"
        run = harness.run_dag(
            "dressage_validate",
            {**conf, "require_skilled_teachers": required, "run_root": str(root)},
        )
        assert run.state == state, harness.states(run)
        (path,) = (root / "dressage_validate").glob("*/report.json")
        report = json.loads(path.read_text())
        found = report["problems"] if required else report["warnings"]
        subjects = {f["subject"] for f in found if "below the floor" in f["message"]}
        assert subjects == {f"teacher {tid!r}" for tid in teachers}, report


def test_a_missing_config_still_gets_its_json_report_and_note(
    airflow_db: None, note_listener: None, tmp_path: Path
) -> None:
    missing = tmp_path / "does_not_exist.json"
    run, report = _run(tmp_path, missing)
    assert run.state == "failed"
    states = harness.states(run)
    assert states["load_config"] == states["check_routes"] == states["check_checkpoints"]
    assert states["load_config"] == "success" and states["report"] == "failed"
    assert report["ok"] is False and report["config"] == str(missing)
    ((subject, message),) = [(p["subject"], p["message"]) for p in report["problems"]]
    assert "no such file" in message.lower(), (subject, message)
    note = harness.note(run)
    assert note.startswith("**report failed**:") and "does\\_not\\_exist.json" in note


def test_a_floor_out_of_range_is_a_problem_of_the_report(airflow_db: None, tmp_path: Path) -> None:
    run = harness.run_dag(
        "dressage_validate",
        {"mopd_config": str(EMBEDDED), "teacher_skill_floor": 1.5, "run_root": str(tmp_path)},
    )
    assert run.state == "failed"
    (path,) = (tmp_path / "dressage_validate").glob("*/report.json")
    problems = json.loads(path.read_text())["problems"]
    assert problems == [
        {
            "subject": "trigger form",
            "message": "Teacher skill floor (teacher_skill_floor) is 1.5: "
            "enter a number from 0 to 1.",
        }
    ]
