"""Run reports: per-teacher series from metrics.jsonl, the summary table, the curves PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from dressage.reporting.curves import main, plot_curves, rolling_mean
from dressage.reporting.metrics import (
    ACCURACY,
    HELDOUT_KL_PREFIX,
    REVERSE_KL,
    REWARD,
    format_summary,
    mopd_markdown,
    read_metrics,
    series,
    summarize,
)

pytestmark = pytest.mark.unit

KL = "rollout/mopd/opd_reverse_kl_train_aggregation_mean/"
RW = "rollout/mopd/raw_reward_trainable_trajectory_mean/"


def _records(steps: int) -> list[dict[str, Any]]:
    out = []
    for s in range(steps):
        metrics: dict[str, Any] = {"train/mopd_reverse_kl": 1.0 / (s + 1)}
        for k, teacher in enumerate(["lookup", "calculator"]):
            metrics[KL + teacher] = (1 + k) * math.exp(-0.2 * s)
            metrics[RW + teacher] = 0.1 * s + k
        out.append({"step": s, "time": float(s), "metrics": metrics})
    return out


def test_series_per_teacher_and_the_run_wide_fallback() -> None:
    records = _records(4)
    kl = series(records, REVERSE_KL)
    assert sorted(kl) == ["calculator", "lookup"]
    assert [s for s, _ in kl["lookup"]] == [0, 1, 2, 3]
    overall = [
        {**r, "metrics": {"train/mopd_reverse_kl": r["metrics"]["train/mopd_reverse_kl"]}}
        for r in records
    ]
    assert list(series(overall, REVERSE_KL)) == ["all"]
    assert series(overall, REWARD) == {}


def test_rolling_mean_is_centred() -> None:
    assert rolling_mean([0.0, 3.0, 6.0, 9.0], 3) == [1.5, 3.0, 6.0, 7.5]
    assert rolling_mean([5.0], 7) == [5.0]


def test_summary_reports_first_and_last_values(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(r) for r in reversed(_records(5))]  # out of order on purpose
    path.write_text("\n".join(lines) + '\n{"step": 9, "tor')  # and a torn last line
    summary = summarize(read_metrics(path), teachers=["lookup"], url="file:///x")
    assert summary.steps == 5
    assert [t.teacher for t in summary.teachers] == ["lookup", "calculator"]
    lookup = summary.teachers[0]
    assert lookup.reverse_kl == (1.0, pytest.approx(math.exp(-0.8)))
    assert lookup.reward == (0.0, pytest.approx(0.4))
    text = format_summary(summary)
    assert "steps: 5   teachers: 2" in text and "1.0000 -> 0.4493" in text
    assert "artifacts: file:///x" in text
    assert summary.to_dict()["teachers"]["calculator"]["reward"] == [1.0, pytest.approx(1.4)]


def test_summary_reports_the_held_out_kl_from_before_training() -> None:
    records = _records(3)
    for r in records:
        s = r["step"]
        r["metrics"] |= {
            f"{HELDOUT_KL_PREFIX}lookup": 2.0 - 0.1 * s,
            f"{HELDOUT_KL_PREFIX}calculator": 1.0 - 0.1 * s,
            f"{HELDOUT_KL_PREFIX}all": 1.5 - 0.1 * s,
        }
    initial = {"lookup": 2.5, "calculator": 1.2, "all": 1.8}
    summary = summarize(records, teachers=["lookup"], heldout_initial=initial)
    rows = {t.teacher: t for t in summary.teachers}
    assert rows["lookup"].heldout_kl == (2.5, pytest.approx(1.8))
    assert rows["all"].heldout_kl == (1.8, pytest.approx(1.3))
    assert rows["all"].reverse_kl is None
    text = format_summary(summary)
    assert "teachers: 2" in text  # the pooled row is not a teacher
    assert "held-out reverse KL (before -> after)" in text and "2.5000 -> 1.8000" in text
    without = summarize(records, teachers=["lookup"])  # no initial: the first step's value
    assert {t.teacher: t.heldout_kl for t in without.teachers}["lookup"] == (2.0, 1.8)
    assert "held-out" not in format_summary(summarize(_records(3)))


def test_summary_reports_held_out_accuracy_per_task_beside_its_teacher() -> None:
    records = _records(3)
    for step, (calc, look) in zip((-1, 1, 2), ((0.0, 0.25), (0.5, 0.5), (0.75, 1.0)), strict=True):
        accuracy = {"calculator": calc, "lookup": look, "all": (calc + look) / 2}
        metrics = {f"eval/accuracy/{t}": v for t, v in accuracy.items()}
        records.append({"step": step, "time": 0.0, "metrics": metrics})  # eval records
    summary = summarize(records, teacher_accuracy={"calculator": 1.0, "lookup": 0.9375})
    assert summary.steps == 3, "the record before training (-1) is no step"
    rows = {a.task: a for a in summary.tasks}
    assert sorted(rows) == ["calculator", "lookup"]  # the pooled value is no task
    assert rows["calculator"].student == (0.0, 0.75) and rows["calculator"].teacher == 1.0
    assert rows["lookup"].student == (0.25, 1.0)
    text = format_summary(summary)
    assert "teacher accuracy" in text
    assert "  calculator  100%              0% -> 75%" in text
    assert "  lookup      94%               25% -> 100%" in text
    assert summary.to_dict()["accuracy"]["lookup"] == {"teacher": 0.9375, "student": [0.25, 1.0]}
    assert [s for s, _ in series(records, ACCURACY)["calculator"]] == [-1, 1, 2]
    note = mopd_markdown(summary).splitlines()
    assert "held-out accuracy calculator 0% → 75%, lookup 25% → 100%" in note[0]  # headline
    assert "| calculator | 100% | 0% → 75% |" in note
    only_teachers = summarize(_records(2), teacher_accuracy={"lookup": 1.0})
    assert [(a.task, a.student) for a in only_teachers.tasks] == [("lookup", None)]
    assert "teacher accuracy" not in format_summary(summarize(_records(2)))


def test_curves_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = plot_curves(_records(30), tmp_path / "c" / "curves.png", title="t")
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    empty = plot_curves([], tmp_path / "empty.png")  # panels that say "no data"
    assert empty.read_bytes().startswith(b"\x89PNG")
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in _records(3)))
    assert main([str(metrics), str(tmp_path / "cli.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli.png")
