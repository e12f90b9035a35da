"""★ Dynamic sampling filters (DAPO): which finished groups a rollout keeps for training.

    --dynamic-sampling-filter-path dressage.rollout.filters.nonzero_reward_std

slime's contract (``--dynamic-sampling-filter-path``): ``fn(args, group)`` returns a
:class:`DynamicFilterOutput` (or a bool); a group not kept is left out of the batch and the
rollout takes further groups until ``rollout_batch_size`` are kept. A GRPO group whose samples all
got the same reward has advantage 0 everywhere: it costs a training forward and backward and
moves nothing, and it dilutes the step's gradient. Both dressage rollouts honour the flag
through :func:`filter_verdict` (:mod:`dressage.rollout.partial_async_rollout`,
:mod:`dressage.rollout.sync_rollout`); slime's own filters work on groups of single samples,
this one also on trajectories that split into segments (the anchor carries the reward).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dressage.rollout.group_generation import GroupResult
from dressage.types import Sample

__all__ = [
    "DynamicFilterOutput",
    "filter_verdict",
    "group_rewards",
    "nonzero_reward_std",
    "nonzero_reward_std_with_fallback",
]


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
    keep = statistics.pstdev(rewards) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{rewards[0]:.1f}")


def nonzero_reward_std_with_fallback(
    args: Any, group: GroupResult, **kwargs: Any
) -> DynamicFilterOutput:
    """:func:`nonzero_reward_std`, but a rejected group is kept when the batch would otherwise
    run short."""
    out = nonzero_reward_std(args, group, **kwargs)
    out.keep_when_insufficient = True
    return out


def filter_verdict(
    fn: Callable[..., Any],
    args: Any,
    group: GroupResult,
    *,
    short: bool,
    metrics: dict[str, float],
    prefix: str = "",
) -> bool:
    """Whether the filter ``fn`` keeps ``group``, as slime's rollout decides it: a bool is
    slime's legacy result; a rejected group marked ``keep_when_insufficient`` is kept when
    ``short`` (without it the batch could not be filled from the groups at hand). A dropped group
    is counted in ``metrics`` under ``<prefix>filtered_groups`` and
    ``<prefix>filtered/<reason>``."""
    out = fn(args, group)  # slime wraps anything but its output type as keep=bool(out)
    keep = bool(getattr(out, "keep", out))
    reason = getattr(out, "reason", None)
    if keep or (getattr(out, "keep_when_insufficient", False) and short):
        return True
    for key in (f"{prefix}filtered_groups", f"{prefix}filtered/{reason or 'rejected'}"):
        metrics[key] = metrics.get(key, 0.0) + 1
    return False
