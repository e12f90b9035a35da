"""The schema-fuzzing loop both services' fuzz tests run (test_engine_fuzz, test_proxy_fuzz)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode


def fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    examples: int,
    statuses: Counter[int],
    failures: list[str],
    *,
    headers: Mapping[str, str] | None = None,
    after: Callable[[Any, Any], None] | None = None,
) -> None:
    """Call ``examples`` cases of ``operation`` drawn in ``mode``; count statuses, and note
    every 5xx (or exception the in-process app let escape) in ``failures``. ``after(operation,
    response)`` runs after each answered call (e.g. to undo a pause)."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(case: Any) -> None:
        try:
            response = case.call(headers=dict(headers or {}))
        except Exception as exc:  # the in-process client re-raises what the app let escape
            statuses[500] += 1
            failures.append(f"{case.method} {case.formatted_path} {mode.value}: {exc!r}")
            return
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path} {mode.value} -> {response.status_code}: "
                f"{response.text[:300]} (body {str(case.body)[:300]})"
            )
        if after is not None:
            after(operation, response)

    try:
        one()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise  # an operation without parameters has no invalid request to draw
