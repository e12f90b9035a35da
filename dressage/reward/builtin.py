"""Built-in task rewards: does the agent's final answer match the label?

Tasks (``metadata["task"]``):

* ``exact_match``: numbers compare as numbers, anything else as normalised text;
* ``calculator``: numeric answers only (arithmetic tasks); ``1,024``, ``1024.0`` and ``2048/2``
  all match ``1024``;
* ``lookup``: normalised text (case, surrounding quotes or markdown, spacing, a final period).

The final answer is the last ``\\boxed{...}``, else what follows the last ``answer:`` (or
``final answer:``), else the last non-empty line of ``sample.response``. The label is
``sample.label``. Each returns 1.0 or 0.0.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from dressage.reward.registry import register_reward
from dressage.slime.sample_meta import describe
from dressage.types import Sample

__all__ = ["final_answer", "normalize_text", "parse_number"]

_ANSWER = re.compile(r"(?:final\s+answer|answer)\s*[:=]\s*", re.IGNORECASE)
_BOXED = "\\boxed{"


def _last_boxed(text: str) -> str | None:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def final_answer(text: str) -> str:
    """The final answer in an agent's response (see the module docstring)."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    markers = list(_ANSWER.finditer(text))
    if markers:
        rest = text[markers[-1].end() :].splitlines()
        return rest[0].strip() if rest else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_text(text: str) -> str:
    """Lower case, single spaces, no surrounding markdown or quotes, no final period."""
    text = text.lstrip(" \t\n*`\"'").rstrip(" \t\n*`\"'.")
    return re.sub(r"\s+", " ", text).lower()


def parse_number(text: str) -> float | None:
    """A number from ``text`` (thousands separators, ``$``/``%`` and fractions allowed)."""
    cleaned = normalize_text(text).replace(",", "").lstrip("$").rstrip("%").replace(" ", "")
    try:
        value = float(Fraction(cleaned)) if "/" in cleaned else float(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def _label(sample: Sample) -> str:
    if sample.label is None:
        raise ValueError(f"{describe(sample)} field=label: the task needs a label to compare")
    return str(sample.label)


def _numbers_match(answer: str, label: str) -> bool | None:
    a, b = parse_number(answer), parse_number(label)
    if a is None or b is None:
        return None
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


@register_reward("exact_match")
def exact_match(args: Any, sample: Sample) -> float:
    answer, label = final_answer(sample.response), _label(sample)
    numeric = _numbers_match(answer, label)
    if numeric is not None:
        return float(numeric)
    return float(normalize_text(answer) == normalize_text(label))


@register_reward("calculator")
def calculator(args: Any, sample: Sample) -> float:
    return float(bool(_numbers_match(final_answer(sample.response), _label(sample))))


@register_reward("lookup")
def lookup(args: Any, sample: Sample) -> float:
    return float(normalize_text(final_answer(sample.response)) == normalize_text(_label(sample)))
