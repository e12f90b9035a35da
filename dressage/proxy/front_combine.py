"""One answer from the workers' answers to a control call the front sent to all of them.

The rules (docs/proxy-performance.md, "Several proxy processes"), field by field, recursively:

- a boolean holds only when it holds on every worker (``paused``: every worker is paused);
- an integer count is summed (``in_flight``, ``paused_calls``, ``released_calls``, the session
  and call counters of ``/v1/stats``, ``rss_bytes``, the store's ``bytes``); the fields of
  :data:`LARGEST` (versions, the pause count, caps, timeouts) and every non-integer number
  (times) take the largest value;
- lists are joined (``damaged_sessions``); any other value is the first worker's that is not
  null (the workers agree on them: ``reason``, ``mode``, ``engine_url``);
- the answer adds ``workers``: each worker's own answer, in worker order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["LARGEST", "combine"]

LARGEST = frozenset(
    {
        "weight_version",
        "engine_weight_version",
        "pauses",
        "auto_resumes",
        "max_pauses_per_trajectory",
        "timeout_seconds",
    }
)
"""Integer fields that every worker holds the same of: the largest is kept, not the sum."""


def _merge(key: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return all(present)
    if all(isinstance(v, dict) for v in present):
        keys = list(dict.fromkeys(k for v in present for k in v))
        return {k: _merge(k, [v.get(k) for v in present]) for k in keys}
    if all(isinstance(v, list) for v in present):
        return [item for v in present for item in v]
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)
    if numbers:
        if key in LARGEST or not all(isinstance(v, int) for v in present):
            return max(present)
        return sum(present)
    return present[0]


def combine(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The front's answer from each worker's JSON answer (the module docstring's rules)."""
    merged = _merge("", list(answers))
    assert isinstance(merged, dict)
    merged["workers"] = list(answers)
    return merged
