"""The embedded driver's eval pass: which rows it measures, the teachers' recorded accuracy, and
the backend calling it after the driver's weight update (the measurement itself runs through a
real engine and proxy in tests/jobs/test_train_job.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dressage.config.mopd import MopdConfig
from dressage.training.embedded.async_backend import EmbeddedAsyncBackend
from dressage.training.embedded.evaluation import heldout_items, teacher_accuracy

pytestmark = pytest.mark.unit


def _rows(path: Path, task: str, n: int) -> str:
    lines = [
        json.dumps({"input": f"{task} question {i}", "label": str(i), "metadata": {"task": task}})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n\n")
    return str(path)


def _config(tmp_path: Path, reports: dict[str, Any]) -> MopdConfig:
    teachers = {}
    for tid, report in reports.items():
        folder = tmp_path / tid
        folder.mkdir()
        if report is not None:
            (folder / "sft_report.json").write_text(
                report if isinstance(report, str) else json.dumps(report)
            )
        teachers[tid] = {"load": str(folder)}
    datasets = [
        {
            "name": "calc",
            "path": _rows(tmp_path / "c.jsonl", "calculator", 2),
            "teacher_id": "t_calc",
            "weight": 1.0,
            "agent_mode": "blackbox",
            "task": "calculator",
            "eval_path": _rows(tmp_path / "c.eval.jsonl", "calculator", 3),
        },
        {
            "name": "look",
            "path": _rows(tmp_path / "l.jsonl", "lookup", 2),
            "teacher_id": "t_look",
            "weight": 1.0,
            "agent_mode": "blackbox",
            "task": "lookup",
        },
    ]
    return MopdConfig.model_validate(
        {"student": {"hf_checkpoint": str(tmp_path)}, "teachers": teachers, "datasets": datasets}
    )


def test_held_out_items_are_the_eval_rows_with_their_dataset_task(tmp_path: Path) -> None:
    config = _config(tmp_path, {"t_calc": None, "t_look": None})
    items = heldout_items(config)
    assert [(i.task, i.prompt, i.label) for i in items] == [
        ("calculator", f"calculator question {i}", str(i)) for i in range(3)
    ]  # the lookup dataset has no eval_path: nothing of it is measured


def test_teacher_accuracy_reads_each_routed_teachers_report(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        {
            "t_calc": {"agent_accuracy": {"calculator": 0.9375, "lookup": 0.0625}},
            "t_look": "{not json",  # unreadable: left out, the preflight reports it
        },
    )
    assert teacher_accuracy(config) == {"calculator": 0.9375}
    other = tmp_path / "other"
    other.mkdir()
    plain = _config(other, {"t_calc": None, "t_look": {"agent_accuracy": {"lookup": 1}}})
    assert teacher_accuracy(plain) == {"lookup": 1.0}  # a checkpoint without a report: none


def test_the_backend_runs_the_evaluator_and_hands_its_metrics_on() -> None:
    seen: list[tuple[int, dict[str, float]]] = []
    backend = EmbeddedAsyncBackend(
        trainer=None,
        rollout_manager=None,
        engine_url="http://127.0.0.1:9",
        weights_dir=Path("unused"),
        version=0,
        evaluator=lambda: {"eval/accuracy/all": 0.5},
        on_evaluated=lambda step, metrics: seen.append((step, metrics)),
    )
    backend.evaluate(4)
    assert seen == [(4, {"eval/accuracy/all": 0.5})]
    assert [e.kind for e in backend.timeline] == ["eval"]
    quiet = EmbeddedAsyncBackend(
        trainer=None, rollout_manager=None, engine_url="x", weights_dir=Path("u"), version=0
    )
    quiet.evaluate(0)  # no evaluator: skipped, nothing recorded
    assert quiet.timeline == []
