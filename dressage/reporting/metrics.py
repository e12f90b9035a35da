"""Per-teacher series out of a run's ``metrics.jsonl``, and the run summary built from them.

    records = read_metrics("runs/x/output/metrics.jsonl")
    kl = series(records, REVERSE_KL)        # {"calculator": [(0, 0.91), (1, 0.87), ...], ...}
    print(format_summary(summarize(records, url="file:///runs/artifacts/...")))

A family of metrics is per teacher when the job logs ``<prefix><teacher_id>`` keys; otherwise
its run-wide key (``train/mopd_reverse_kl``, ...) gives one series labelled ``all``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ACCURACY",
    "HELDOUT_KL",
    "HELDOUT_KL_PREFIX",
    "REVERSE_KL",
    "REWARD",
    "TOPK_STUDENT_TAIL",
    "TOPK_TEACHER_TAIL",
    "Family",
    "RunSummary",
    "TaskAccuracy",
    "format_summary",
    "mopd_markdown",
    "parse_metrics",
    "read_metrics",
    "series",
    "summarize",
]


@dataclass(frozen=True)
class Family:
    title: str
    per_teacher: tuple[str, ...]
    overall: tuple[str, ...]


REVERSE_KL = Family(
    "reverse KL (student || teacher)",
    per_teacher=("rollout/mopd/opd_reverse_kl_train_aggregation_mean/",),
    overall=("train/mopd_reverse_kl",),
)
HELDOUT_KL_PREFIX = "eval/mopd/reverse_kl/"
"""Exact reverse KL on the held-out rows (:mod:`dressage.training.embedded.probe`); the key
``<prefix>all`` pools every teacher's tokens."""
HELDOUT_KL = Family(
    "held-out reverse KL (exact, fixed held-out contexts)",
    per_teacher=(HELDOUT_KL_PREFIX,),
    overall=(),
)
REWARD = Family(
    "reward",
    per_teacher=(
        "rollout/mopd/raw_reward_trainable_trajectory_mean/",
        "rollout/raw_reward_trainable_trajectory_mean/",
    ),
    overall=("rollout/raw_reward", "rollout/reward_mean", "train/reward"),
)

ACCURACY = Family(
    "held-out accuracy (agent loop, greedy)",
    per_teacher=("eval/accuracy/",),
    overall=(),
)
"""Per task (:mod:`dressage.training.embedded.evaluation`); the record of step ``-1`` is the
measurement before training."""

TOPK_TEACHER_TAIL = Family(
    "teacher mass outside the top-k support",
    per_teacher=(),
    overall=("train/mopd_topk_teacher_tail_mass",),
)
TOPK_STUDENT_TAIL = Family(
    "student mass outside the top-k support",
    per_teacher=(),
    overall=("train/mopd_topk_student_tail_mass",),
)
"""With ``--mopd-objective topk``: how much of each distribution the support leaves in its tail
bucket (:mod:`dressage.training.mopd_topk`), per training step."""

Series = dict[str, list[tuple[int, float]]]
ALL_TEACHERS = "all"
"""The pooled row of the held-out reverse KL (every teacher's tokens)."""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl file (see :func:`parse_metrics`)."""
    return parse_metrics(Path(path).read_text())


def parse_metrics(text: str) -> list[dict[str, Any]]:
    """Every record of metrics.jsonl text, sorted by step; a torn last line is skipped."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("metrics"), dict):
            records.append(record)
    return sorted(records, key=lambda r: int(r.get("step", 0)))


def _points(records: Iterable[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for r in records:
        value = r["metrics"].get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append((int(r["step"]), float(value)))
    return out


def series(records: Sequence[dict[str, Any]], family: Family) -> Series:
    """One (step, value) list per teacher, or ``{"all": ...}`` from the run-wide key."""
    found: Series = {}
    for prefix in family.per_teacher:
        keys = sorted({k for r in records for k in r["metrics"] if k.startswith(prefix)})
        for key in keys:
            points = _points(records, key)
            if points:
                found.setdefault(key[len(prefix) :], points)
    if found:
        return found
    for key in family.overall:
        points = _points(records, key)
        if points:
            return {"all": points}
    return {}


@dataclass
class TeacherSummary:
    teacher: str
    reverse_kl: tuple[float, float] | None = None
    """(first, last) step values."""
    reward: tuple[float, float] | None = None
    heldout_kl: tuple[float, float] | None = None
    """(before training, after the last step) on the held-out rows."""


@dataclass
class TaskAccuracy:
    task: str
    teacher: float | None = None
    """The accuracy its teacher's ``sft_report.json`` records on this task (same measurement)."""
    student: tuple[float, float] | None = None
    """(before training, after the last step)."""


@dataclass
class RunSummary:
    steps: int
    teachers: list[TeacherSummary] = field(default_factory=list)
    url: str | None = None
    curves: str | None = None
    tasks: list[TaskAccuracy] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "url": self.url,
            "curves": self.curves,
            "teachers": {
                t.teacher: {
                    "reverse_kl": list(t.reverse_kl) if t.reverse_kl else None,
                    "reward": list(t.reward) if t.reward else None,
                    "heldout_reverse_kl": list(t.heldout_kl) if t.heldout_kl else None,
                }
                for t in self.teachers
            },
            "accuracy": {
                a.task: {
                    "teacher": a.teacher,
                    "student": list(a.student) if a.student else None,
                }
                for a in self.tasks
            },
        }


def _ends(points: list[tuple[int, float]] | None) -> tuple[float, float] | None:
    return (points[0][1], points[-1][1]) if points else None


def summarize(
    records: Sequence[dict[str, Any]],
    *,
    teachers: Iterable[str] = (),
    url: str | None = None,
    curves: str | None = None,
    heldout_initial: Mapping[str, float] | None = None,
    teacher_accuracy: Mapping[str, float] | None = None,
) -> RunSummary:
    """Per teacher: the first and last step's reverse KL and reward, and the held-out reverse KL
    from before training (``heldout_initial``, else the first step) to the last step. Per task:
    the held-out accuracy before training and after the last step, beside its teacher's
    (``teacher_accuracy``, task -> accuracy)."""
    kl, reward = series(records, REVERSE_KL), series(records, REWARD)
    heldout = series(records, HELDOUT_KL)
    names = list(dict.fromkeys([*teachers, *kl, *reward]))
    if len(heldout) > 1 and ALL_TEACHERS in heldout:
        names.append(ALL_TEACHERS)
    steps = len({int(r["step"]) for r in records if int(r["step"]) >= 0})  # -1: before
    rows = []
    for n in names:
        ends = _ends(heldout.get(n))
        if ends is not None and heldout_initial and n in heldout_initial:
            ends = (float(heldout_initial[n]), ends[1])
        rows.append(TeacherSummary(n, _ends(kl.get(n)), _ends(reward.get(n)), ends))
    accuracy = series(records, ACCURACY)
    known = dict(teacher_accuracy or {})
    tasks = [
        TaskAccuracy(task, known.get(task), _ends(accuracy.get(task)))
        for task in dict.fromkeys([*sorted(set(accuracy) - {ALL_TEACHERS}), *known])
    ]
    return RunSummary(steps=steps, teachers=rows, url=url, curves=curves, tasks=tasks)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _pair(values: tuple[float, float] | None) -> str:
    return "-" if values is None else f"{values[0]:.4f} -> {values[1]:.4f}"


def format_summary(summary: RunSummary) -> str:
    """The end-of-run table: teachers, steps, reverse KL and reward (first -> last step)."""
    width = max([len("teacher"), *(len(t.teacher) for t in summary.teachers)])
    teachers = [t for t in summary.teachers if t.teacher != ALL_TEACHERS]
    lines = [f"steps: {summary.steps}   teachers: {len(teachers)}"]
    heldout = any(t.heldout_kl for t in summary.teachers)
    head = f"  {'teacher':<{width}}  {'reverse KL (first -> last)':<28}  "
    head += f"{'reward (first -> last)':<24}"
    if heldout:
        head += "  held-out reverse KL (before -> after)"
    lines.append(head.rstrip())
    for t in summary.teachers:
        line = f"  {t.teacher:<{width}}  {_pair(t.reverse_kl):<28}  {_pair(t.reward):<24}"
        if heldout:
            line += f"  {_pair(t.heldout_kl)}"
        lines.append(line.rstrip())
    if summary.tasks:
        width = max(len("task"), *(len(a.task) for a in summary.tasks))
        lines.append(
            f"  {'task':<{width}}  {'teacher accuracy':<16}  held-out accuracy (before -> after)"
        )
        for a in summary.tasks:
            student = "-" if a.student is None else f"{a.student[0]:.0%} -> {a.student[1]:.0%}"
            lines.append(f"  {a.task:<{width}}  {_share(a.teacher):<16}  {student}")
    if summary.url:
        lines.append(f"artifacts: {summary.url}")
    if summary.curves:
        lines.append(f"curves:    {summary.curves}")
    return "\n".join(lines)


def _short(values: tuple[float, float] | None) -> str:
    return "-" if values is None else f"{values[0]:.3f} → {values[1]:.3f}"


def _headline(summary: RunSummary) -> str:
    """The numbers a reader wants first: held-out accuracy per task, else the pooled held-out
    reverse KL, else the trained one."""
    measured = [a for a in summary.tasks if a.student]
    if measured:
        parts = [f"{a.task} {_pct(a.student)}" for a in measured]
        return "held-out accuracy " + ", ".join(parts) + " (before → after)"
    by_name = {t.teacher: t for t in summary.teachers}
    pooled = by_name.get(ALL_TEACHERS)
    if pooled is not None and pooled.heldout_kl:
        return f"held-out reverse KL {_short(pooled.heldout_kl)} (before → after)"
    kl = [t.heldout_kl or t.reverse_kl for t in summary.teachers]
    known = [k for k in kl if k]
    if not known:
        return "no metrics"
    first, last = (sum(k[i] for k in known) / len(known) for i in (0, 1))
    return f"reverse KL {first:.3f} → {last:.3f} (mean over teachers)"


def mopd_markdown(summary: RunSummary) -> str:
    """The summary as markdown for the run's note: a one-line headline (the UI shows the
    note's first line on the run's page), then a table per teacher."""
    teachers = [t for t in summary.teachers if t.teacher != ALL_TEACHERS]
    heldout = any(t.heldout_kl for t in summary.teachers)
    head = "| teacher | reverse KL | reward |" + (" held-out reverse KL |" if heldout else "")
    lines = [
        f"**MOPD, {summary.steps} step(s), {len(teachers)} teacher(s)**: {_headline(summary)}",
        "",
        "First → last step" + ("; held-out: before → after training." if heldout else "."),
        "",
        head,
        "|---|---|---|" + ("---|" if heldout else ""),
    ]
    for t in summary.teachers:
        row = f"| {t.teacher} | {_short(t.reverse_kl)} | {_short(t.reward)} |"
        lines.append(row + (f" {_short(t.heldout_kl)} |" if heldout else ""))
    if summary.tasks:
        lines += ["", "| task | teacher accuracy | held-out accuracy |", "|---|---|---|"]
        lines += [f"| {a.task} | {_share(a.teacher)} | {_pct(a.student)} |" for a in summary.tasks]
    return "\n".join(lines)


def _pct(values: tuple[float, float] | None) -> str:
    return "-" if values is None else f"{values[0]:.0%} → {values[1]:.0%}"
