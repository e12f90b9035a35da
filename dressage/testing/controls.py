"""The controls of a MOPD transfer experiment, and the verdict on them (``bench/mopd_transfer.py``).

    conditions = control_conditions(EMBEDDED)      # configured, swapped, one teacher each
    verdict = transfer_verdict(table, own_teacher_of(EMBEDDED))

A skill moves from the teacher that has it, and only from it, when the student trained with the
configured routing beats, on each task:

- ``swapped``: each task scored by the other task's teacher;
- ``no_training``: the student as it starts;
- ``one_teacher:<u>`` for every teacher ``u`` that is not the task's own: one teacher for all
  tasks, so the task is scored by a teacher that lacks its skill.

``one_teacher:<u>`` on ``u``'s own task routes that task exactly as the configured run does, so
the comparison there cannot separate them; it enters through the worst task instead: with the
configured routing the student's worst task must beat every one-teacher student's worst task
(one teacher, whichever it is, leaves a task untaught). Every comparison is beyond the spreads:
the lower mean minus its spread above the higher mean plus its spread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dressage.testing.mopd_run import Routing

__all__ = [
    "NO_TRAINING",
    "Condition",
    "control_conditions",
    "own_teacher_of",
    "transfer_verdict",
]

NO_TRAINING = "no_training"
Table = dict[str, dict[str, tuple[float, float]]]
"""condition name -> task -> (mean, spread) of the student's held-out accuracy over seeds."""


@dataclass(frozen=True)
class Condition:
    """One routing of the teachers; ``teacher`` only for ``one_teacher``."""

    routing: Routing
    teacher: str | None = None

    @property
    def name(self) -> str:
        return f"{self.routing}:{self.teacher}" if self.teacher else self.routing


def own_teacher_of(config: Path) -> dict[str, str]:
    """Task -> the teacher the MOPD config ``config`` routes it to."""
    datasets = json.loads(config.read_text())["datasets"]
    return {ds.get("task") or ds["name"]: ds["teacher_id"] for ds in datasets}


def control_conditions(config: Path) -> list[Condition]:
    """The configured routing, the swapped one, and one teacher for all tasks, each teacher."""
    teachers = dict.fromkeys(own_teacher_of(config).values())
    return [
        Condition("configured"),
        Condition("swapped"),
        *(Condition("one_teacher", t) for t in teachers),
    ]


def _above(ours: tuple[float, float], other: tuple[float, float]) -> float:
    """How far ``ours`` is above ``other`` beyond both spreads (> 0: separated)."""
    return (ours[0] - ours[1]) - (other[0] + other[1])


def transfer_verdict(table: Table, own_teacher: dict[str, str]) -> dict[str, Any]:
    """The configured run against every control (module docstring); ``table`` needs
    ``configured``, ``no_training`` and the other conditions' rows for every task of
    ``own_teacher``. ``ours``/``baseline``: the configured accuracy and the strongest control's
    on the task where the configured run leads least."""
    configured = table["configured"]
    missing = [
        f"{name}/{task}" for name in ("configured", NO_TRAINING) for task in own_teacher
        if task not in table.get(name, {})
    ]  # fmt: skip
    if missing:
        raise ValueError(f"the table lacks {missing}")
    per_task: dict[str, dict[str, Any]] = {}
    for task, teacher in own_teacher.items():
        controls = {
            name: row[task] for name, row in table.items()
            if name != "configured" and name != f"one_teacher:{teacher}"
        }  # fmt: skip
        strongest = max(controls, key=lambda name: sum(controls[name]))
        per_task[task] = {
            "strongest_control": strongest,
            "margin": round(_above(configured[task], controls[strongest]), 4),
            "ours": configured[task][0],
            "baseline": controls[strongest][0],
        }
    worst_ours = min((configured[task] for task in own_teacher), key=lambda v: v[0] - v[1])
    worst_task: dict[str, float] = {}
    for name, row in table.items():
        if name.startswith("one_teacher"):
            m, s = min((row[task] for task in own_teacher), key=lambda v: v[0] + v[1])
            worst_task[name] = round(_above(worst_ours, (m, s)), 4)
    task = min(per_task, key=lambda t: per_task[t]["margin"])
    met = all(v["margin"] > 0 for v in per_task.values()) and all(
        m > 0 for m in worst_task.values()
    )
    return {
        "task": task,
        "ours": round(per_task[task]["ours"], 4),
        "baseline": round(per_task[task]["baseline"], 4),
        "ratio": round(per_task[task]["ours"] / max(per_task[task]["baseline"], 0.01), 3),
        "met": met,
        "per_task": per_task,
        "worst_task_margin": worst_task,
    }
