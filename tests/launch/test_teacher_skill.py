"""The teacher-skill check of the preflight: a teacher's recorded own-task accuracy vs a floor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dressage.config.mopd import MopdConfig
from dressage.launch.preflight import skill_findings, teacher_skill_problems

pytestmark = pytest.mark.unit


def _config(tmp_path: Path, reports: dict[str, Any]) -> MopdConfig:
    teachers = {}
    for tid, report in reports.items():
        folder = tmp_path / tid
        folder.mkdir()
        if report is not None:
            text = report if isinstance(report, str) else json.dumps(report)
            (folder / "sft_report.json").write_text(text)
        teachers[tid] = {"load": str(folder)}
    data = tmp_path / "rows.jsonl"
    data.write_text('{"input": "x", "label": "1"}\n')
    datasets = [
        {
            "name": tid,
            "path": str(data),
            "teacher_id": tid,
            "task": task,
            "weight": 1.0,
            "agent_mode": "blackbox",
        }
        for tid, task in (("calc", "calculator"), ("look", "lookup"), ("other", "lookup"))
        if tid in teachers
    ]
    return MopdConfig.model_validate({"teachers": teachers, "datasets": datasets})


def test_a_teacher_below_the_floor_on_its_own_task_is_named_with_its_accuracy(
    tmp_path: Path,
) -> None:
    config = _config(
        tmp_path,
        {
            "calc": {"agent_accuracy": {"calculator": 0.95, "lookup": 0.0}},
            "look": {"agent_accuracy": {"calculator": 1.0, "lookup": 0.5}},
        },
    )
    (problem,) = teacher_skill_problems(config, floor=0.9)
    assert problem.subject == "teacher 'look'"
    assert (
        "solves 50% of held-out 'lookup'" in problem.message and "floor of 90%" in problem.message
    )
    assert teacher_skill_problems(config, floor=0.5) == []


def test_reports_without_a_measurement_are_findings_and_other_checkpoints_are_skipped(
    tmp_path: Path,
) -> None:
    config = _config(
        tmp_path,
        {
            "calc": {"losses": [1.0]},  # an older report: no agent_accuracy
            "look": "{not json",
            "other": None,  # not project-built: nothing recorded, nothing run
        },
    )
    found = {p.subject: p.message for p in teacher_skill_problems(config)}
    assert set(found) == {"teacher 'calc'", "teacher 'look'"}
    assert "records no agent_accuracy" in found["teacher 'calc'"]
    assert "is unreadable" in found["teacher 'look'"]


def test_required_skill_turns_findings_into_problems_and_grpo_skips_the_check(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, {"calc": {"agent_accuracy": {"calculator": 0.1}}})
    problems, warnings = skill_findings(config, objective="mopd", floor=0.9, required=False)
    assert problems == [] and [w.subject for w in warnings] == ["teacher 'calc'"]
    problems, warnings = skill_findings(config, objective="mopd", floor=0.9, required=True)
    assert [p.subject for p in problems] == ["teacher 'calc'"] and warnings == []
    assert skill_findings(config, objective="grpo", floor=0.9, required=True) == ([], [])
