"""★ Dynamic sampling filters (DAPO): which finished groups a rollout keeps for training.

    --dynamic-sampling-filter-path dressage.rollout.filters.nonzero_reward_std

slime's contract (``--dynamic-sampling-filter-path``): ``fn(args, group)`` returns a
:class:`DynamicFilterOutput` (or a bool); a group not kept is left out of the batch and the
rollout takes further groups until ``rollout_batch_size`` are kept. A GRPO group whose samples all
got the same reward has advantage 0 everywhere: it costs a training forward and backward and
moves nothing, and it dilutes the step's gradient. The partial-async rollout honours the flag
(:mod:`dressage.rollout.partial_async_rollout`); slime's own filters work on groups of single
samples, this one also on trajectories that split into segments (the anchor carries the reward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dressage.rollout.group_generation import GroupResult
from dressage.types import Sample

__all__ = ["DynamicFilterOutput", "nonzero_reward_std", "nonzero_reward_std_with_fallback"]


@dataclass
class DynamicFilterOutput:
    """slime's filter result (same fields): ``keep_when_insufficient`` keeps a rejected group
    when dropping it would leave too few groups to fill the batch."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def _anchor(item: Sample | list[Sample]) -> Sample:
    """The sample that carries a trajectory's reward: a split trajectory's last segment (its
    siblings hold a 0.0 placeholder until reward post-processing broadcasts the anchor's;
    :mod:`dressage.rollout.multi_segment`)."""
    return item[-1] if isinstance(item, list) else item


def group_rewards(args: Any, group: GroupResult) -> list[float]:
    """One reward per trajectory of the group (``--reward-key`` honoured)."""
    return [_anchor(item).get_reward_value(args) for item in group]


def nonzero_reward_std(args: Any, group: GroupResult, **_: Any) -> DynamicFilterOutput:
    """Keep a group only when its trajectories' rewards differ."""
    rewards = group_rewards(args, group)
    mean = sum(rewards) / len(rewards)
    spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    keep = spread > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{rewards[0]:.1f}")


def nonzero_reward_std_with_fallback(
    args: Any, group: GroupResult, **kwargs: Any
) -> DynamicFilterOutput:
    """:func:`nonzero_reward_std`, but a rejected group is kept when the batch would otherwise
    run short."""
    out = nonzero_reward_std(args, group, **kwargs)
    out.keep_when_insufficient = True
    return out
