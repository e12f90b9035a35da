"""slime's dynamic sampling in the synchronous rollout: rejected groups are replaced by fresh
prompts until the batch is full; a fallback filter starts no extra round; a filter that rejects
everything fails the call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dressage.rollout import sync_rollout
from dressage.types import RolloutFnTrainOutput
from tests.rollout import partial_async_hooks as hooks

pytestmark = pytest.mark.unit

HOOKS = "tests.rollout.partial_async_hooks"


def _args(filter_path: str) -> SimpleNamespace:
    return hooks.rollout_args(
        custom_rm_path=f"{HOOKS}.reward_odd_groups_vary", dynamic_sampling_filter_path=filter_path
    )


def _rollout(args: Any, source: Any) -> RolloutFnTrainOutput:
    out = sync_rollout.generate_rollout(args, 0, source)
    assert isinstance(out, RolloutFnTrainOutput)
    return out


def test_rejected_groups_are_replaced_by_fresh_prompts() -> None:
    out = _rollout(_args("dressage.rollout.filters.nonzero_reward_std"), hooks.ListDataSource())
    assert [g[0].group_index for g in out.samples] == [1, 3]  # even groups have zero spread
    assert out.metrics is not None
    assert out.metrics["rollout/filtered_groups"] == 2  # groups 0 and 2
    assert out.metrics["rollout/filtered/zero_std_0.0"] == 2
    assert out.metrics["rollout/prompts"] == 4


def test_a_fallback_filter_keeps_a_rejected_group_rather_than_start_another_round() -> None:
    args = _args("dressage.rollout.filters.nonzero_reward_std_with_fallback")
    out = _rollout(args, hooks.ListDataSource())
    assert [g[0].group_index for g in out.samples] == [0, 1]
    assert out.metrics is not None and out.metrics["rollout/prompts"] == 2


def test_a_filter_that_rejects_everything_fails_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_rollout, "MAX_FILTERED_ROUNDS", 1)
    with pytest.raises(RuntimeError, match=r"left 0 of 2 groups after 1 rounds"):
        _rollout(_args(f"{HOOKS}.reject_every_group"), hooks.ListDataSource())
