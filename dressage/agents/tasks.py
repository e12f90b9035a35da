"""Task instances of the small environments, with the ideal way to solve each.

    make_instances("calculator", 4, seed=0)[0].prompt   # "Compute 41 * 7. Reply with ..."

The prompts follow the embedded default's datasets (``configs/mopd/data/*.jsonl``). Each
instance knows its ``label`` and the one tool call that solves it (:attr:`TaskInstance.call`),
which is what a teacher is fine-tuned to do (:mod:`dressage.tiny.teachers`): call the tool,
read the result, answer with it. Deterministic in ``seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from dressage.agents.tools import calculate, format_number

__all__ = ["TASKS", "TaskInstance", "make_instances"]

TASKS = ("calculator", "lookup")

_FRUITS = (
    "apple", "fig", "grape", "kiwi", "lemon", "mango", "melon", "olive", "peach", "pear", "plum",
)  # fmt: skip
_SUFFIX = "Reply with the number only."


@dataclass(frozen=True)
class TaskInstance:
    """One prompt of a task, its label, and the tool call that solves it."""

    task: str
    prompt: str
    label: str
    tool: str
    arguments: dict[str, Any]

    def to_row(self, row_id: str) -> dict[str, Any]:
        """A dataset row (``input``, ``label``, ``metadata.task``) like the config's data."""
        return {
            "id": row_id,
            "input": self.prompt,
            "label": self.label,
            "metadata": {"task": self.task},
        }


def _calculator(rng: random.Random) -> TaskInstance:
    op = rng.choice("+-*")
    a = rng.randint(2, 60)
    b = rng.randint(2, 25) if op == "*" else rng.randint(2, 30)
    expression = f"{a} {op} {b}"
    return TaskInstance(
        task="calculator",
        prompt=f"Compute {expression}. {_SUFFIX}",
        label=format_number(calculate(expression)),
        tool="calculator",
        arguments={"expression": expression},
    )


def _lookup(rng: random.Random) -> TaskInstance:
    keys = rng.sample(_FRUITS, 4)
    values = [rng.randint(1, 99) for _ in keys]
    asked = rng.randrange(len(keys))
    table = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
    return TaskInstance(
        task="lookup",
        prompt=f"Table: {table}. What is the value of {keys[asked]}? {_SUFFIX}",
        label=str(values[asked]),
        tool="lookup",
        arguments={"key": keys[asked]},
    )


def make_instances(task: str, n: int, *, seed: int = 0) -> list[TaskInstance]:
    """``n`` instances of ``task`` (one of :data:`TASKS`), the same for the same seed."""
    makers = {"calculator": _calculator, "lookup": _lookup}
    if task not in makers:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    rng = random.Random(f"{task}:{seed}")
    return [makers[task](rng) for _ in range(n)]
