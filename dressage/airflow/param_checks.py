"""The checks of trigger-form values that Airflow's form cannot make, as one sentence each.

Airflow 3's trigger form refuses, with a message under the field, only what its widgets check:
an empty field whose type has no ``"null"``, an object field that is not JSON. A number field
with ``minimum``/``maximum`` clamps an out-of-range value when it loses focus (0 becomes 1
without a word), and a ``pattern`` is checked only by the API server, whose refusal is a raw
JSON-Schema dump. So the Params give those fields no range or pattern; the range is stated in
the field's description, and the first task of a run checks it here:

    problems = training_problems(params)   # [] or ["Training steps (steps) is 0: ...", ...]

Each problem names the field (title and key), the value, and what to enter instead. The run
fails at once with them (the first task's log and the run's note), before anything starts.
No airflow import: the Params module and the tasks share these rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ARTIFACT_SCHEMES",
    "NumberRule",
    "TRAINING_NUMBERS",
    "VALIDATION_NUMBERS",
    "number_problem",
    "training_problems",
    "validation_problems",
]

ARTIFACT_SCHEMES = ("file", "s3", "gs", "gcs", "memory")


@dataclass(frozen=True)
class NumberRule:
    """A number field's title and range: ``low <= value`` (``low < value`` when ``open_low``)."""

    title: str
    low: float
    high: float | None = None
    whole: bool = False
    open_low: bool = False

    def describe(self) -> str:
        """The range as the form's description states it, e.g. "A whole number from 1 to 10."."""
        kind = "A whole number" if self.whole else "A number"
        low, high = _show(self.low), _show(self.high) if self.high is not None else None
        if self.open_low:
            return f"{kind} above {low}."
        if high is not None:
            return f"{kind} from {low} to {high}."
        return f"{kind}, {low} or more."


def _show(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


TRAINING_NUMBERS: dict[str, NumberRule] = {
    "steps": NumberRule("Training steps", 1, 1_000_000, whole=True),
    "seed": NumberRule("Seed", 0, whole=True),
    "rollout_batch_size": NumberRule("Rollout batch size", 1, 65_536, whole=True),
    "learning_rate": NumberRule("Learning rate", 0, open_low=True),
    "job_timeout_minutes": NumberRule("Job timeout (minutes)", 1, 10_080, whole=True),
    "poll_seconds": NumberRule("Status poll interval (s)", 0.2, 3600),
}
VALIDATION_NUMBERS: dict[str, NumberRule] = {
    "teacher_skill_floor": NumberRule("Teacher skill floor", 0, 1),
}


def number_problem(key: str, value: Any, rule: NumberRule) -> str | None:
    """One sentence when ``value`` breaks ``rule`` (None is left to the field's type)."""
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and rule.whole:
        ok = float(value).is_integer()
    if ok:
        ok = value > rule.low if rule.open_low else value >= rule.low
        ok = ok and (rule.high is None or value <= rule.high)
    if ok:
        return None
    wanted = rule.describe()
    return f"{rule.title} ({key}) is {value!r}: enter {wanted[0].lower()}{wanted[1:]}"


def _numbers(params: Mapping[str, Any], rules: Mapping[str, NumberRule]) -> list[str]:
    found = [number_problem(key, params.get(key), rule) for key, rule in rules.items()]
    return [p for p in found if p]


def _artifact_root_problem(value: Any) -> str | None:
    text = str(value or "").strip()
    if "://" not in text:
        return None if text and ":" not in text else _root_sentence(text)
    scheme, rest = text.split("://", 1)
    return None if scheme in ARTIFACT_SCHEMES and rest else _root_sentence(text)


def _root_sentence(text: str) -> str:
    schemes = ", ".join(f"{s}://" for s in ARTIFACT_SCHEMES[:3])
    return (
        f"Artifact root (artifact_root) is {text!r}: enter a folder or a {schemes} URL "
        "(http:// cannot be written to)."
    )


def _ray_address_problem(params: Mapping[str, Any]) -> str | None:
    if params.get("backend") != "ray":
        return None  # the embedded backend never reads it
    address = str(params.get("ray_address") or "")
    if address.startswith(("http://", "https://")) and len(address.split("://", 1)[1]) > 0:
        return None
    return (
        f"Ray dashboard address (ray_address) is {address!r}: the ray backend needs the "
        "dashboard's http:// URL, such as http://head-node:8265."
    )


def training_problems(params: Mapping[str, Any]) -> list[str]:
    """Every value of a training DAG's Params that the form let through and a run cannot use."""
    found = _numbers(params, TRAINING_NUMBERS)
    found += [p for p in (_artifact_root_problem(params.get("artifact_root")),) if p]
    found += [p for p in (_ray_address_problem(params),) if p]
    if params.get("backend") == "ray" and not str(params.get("ray_python") or "").strip():
        found.append(
            "Python on the cluster (ray_python) is empty: the ray backend needs the "
            "interpreter of the job's entrypoint, such as python3."
        )
    return found


def validation_problems(params: Mapping[str, Any]) -> list[str]:
    """Every value of ``dressage_validate``'s Params that the form let through and is unusable."""
    return _numbers(params, VALIDATION_NUMBERS)
