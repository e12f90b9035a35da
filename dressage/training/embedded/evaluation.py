"""Held-out task accuracy of the student the engine serves: the embedded driver's eval pass.

    accuracy = HeldOutAccuracy.from_config(config, proxy_url=PROXY, admin_key=KEY)
    accuracy.measure()          # {"eval/accuracy/calculator": 0.25, ..., "eval/accuracy/all": ...}

slime's async loop calls ``rollout_manager.eval(rollout_id)`` at ``--eval-interval``, right
after the weight update, so the engine serves the weights just trained. The embedded backend's
``evaluate`` calls :meth:`HeldOutAccuracy.measure` there: every row of the datasets'
``eval_path`` files (held-out rows, never trained on) goes through the built-in tool agent at
the recording proxy, greedy, with the task's tools and its exact-match reward, in sessions that
are discarded afterwards (:func:`dressage.agents.evaluate.measure_accuracy`). The settings are
those a tiny teacher's ``sft_report.json`` was measured with
(:data:`dressage.tiny.teachers.AGENT_EVAL`), so student and teacher accuracies compare.

Keys: ``eval/accuracy/<task>`` per task, ``eval/accuracy/all`` over every row, and
``eval/accuracy_errors/<task>`` when agent runs failed (they score 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dressage.agents.evaluate import EvalItem, items_from_jsonl, measure_accuracy

if TYPE_CHECKING:
    from dressage.config.mopd import MopdConfig

__all__ = [
    "ACCURACY_PREFIX",
    "ERRORS_PREFIX",
    "HeldOutAccuracy",
    "heldout_items",
    "teacher_accuracy",
]

ACCURACY_PREFIX = "eval/accuracy/"
ERRORS_PREFIX = "eval/accuracy_errors/"


def heldout_items(config: MopdConfig) -> list[EvalItem]:
    """Every ``eval_path`` row of the config's datasets, with its dataset's task (or the row's
    ``metadata.task`` when the dataset names none)."""
    items: list[EvalItem] = []
    for ds in config.datasets:
        if ds.eval_path:
            items += items_from_jsonl(ds.eval_path, task=ds.task)
    return items


def teacher_accuracy(config: MopdConfig) -> dict[str, float]:
    """Task -> the accuracy on it that the teacher routed to it records in its
    ``sft_report.json`` (project-built teachers; others have none and are left out).
    ``config`` is materialized (teacher ``load`` values are folders)."""
    out: dict[str, float] = {}
    for ds in config.datasets:
        teacher = config.teachers.get(ds.teacher_id or "")
        report = Path(teacher.load) / "sft_report.json" if teacher is not None else None
        if not ds.task or report is None or not report.is_file():
            continue
        try:
            value = (json.loads(report.read_text()).get("agent_accuracy") or {}).get(ds.task)
        except (OSError, ValueError, AttributeError):
            continue  # the preflight reports an unreadable report; a summary does without it
        if isinstance(value, int | float):
            out[ds.task] = float(value)
    return out


@dataclass
class HeldOutAccuracy:
    """See the module docstring."""

    items: list[EvalItem]
    proxy_url: str
    admin_key: str | None
    api_key: str | None = None
    max_turns: int = 2
    max_tokens: int = 64

    @classmethod
    def from_config(
        cls, config: MopdConfig, *, proxy_url: str, admin_key: str | None, api_key: str | None
    ) -> HeldOutAccuracy | None:
        """None when no dataset has held-out rows."""
        from dressage.tiny.teachers import AGENT_EVAL

        items = heldout_items(config)
        if not items:
            return None
        return cls(
            items,
            proxy_url,
            admin_key,
            api_key,
            max_turns=int(AGENT_EVAL["max_turns"]),
            max_tokens=int(AGENT_EVAL["max_tokens"]),
        )

    def measure(self) -> dict[str, float]:
        """One pass over the rows; see the module docstring for the keys."""
        report = measure_accuracy(
            self.proxy_url,
            self.items,
            max_turns=self.max_turns,
            max_tokens=self.max_tokens,
            api_key=self.api_key,
            admin_key=self.admin_key,
        )
        out = {f"{ACCURACY_PREFIX}{task}": value for task, value in report.accuracy.items()}
        total = sum(report.count.values())
        solved = sum(report.accuracy[t] * report.count[t] for t in report.count)
        out[f"{ACCURACY_PREFIX}all"] = solved / total if total else 0.0
        out |= {f"{ERRORS_PREFIX}{t}": float(n) for t, n in report.errors.items() if n}
        return out
