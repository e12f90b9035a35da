"""Dynamic sampling filters: a group is kept only when its trajectories' rewards differ."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dressage.rollout.filters import (
    DynamicFilterOutput,
    nonzero_reward_std,
    nonzero_reward_std_with_fallback,
)
from dressage.types import Sample

pytestmark = pytest.mark.unit


def _sample(reward: object) -> Sample:
    return Sample(prompt="p", reward=reward)  # type: ignore[arg-type]


def test_a_group_with_equal_rewards_is_dropped_with_the_reward_as_reason() -> None:
    args = SimpleNamespace(reward_key=None)
    assert nonzero_reward_std(args, [_sample(0.0), _sample(0.0)]) == DynamicFilterOutput(
        keep=False, reason="zero_std_0.0"
    )
    assert nonzero_reward_std(args, [_sample(0.0), _sample(1.0)]).keep


def test_a_split_trajectory_counts_once_by_its_anchors_reward() -> None:
    args = SimpleNamespace(reward_key=None)
    # the second trajectory split into two segments: the last (the anchor) carries its
    # reward, the first a 0.0 placeholder
    group = [_sample(0.0), [_sample(0.0), _sample(1.0)]]
    assert nonzero_reward_std(args, group).keep
    assert not nonzero_reward_std(args, [_sample(1.0), [_sample(0.0), _sample(1.0)]]).keep


def test_the_reward_key_picks_the_value_and_the_fallback_marks_the_output() -> None:
    args = SimpleNamespace(reward_key="score")
    group = [_sample({"score": 1.0, "x": 0}), _sample({"score": 1.0, "x": 5})]
    out = nonzero_reward_std_with_fallback(args, group)
    assert not out.keep and out.keep_when_insufficient and out.reason == "zero_std_1.0"
