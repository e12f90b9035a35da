"""slime's reward hook over the task-reward registry: scores anchors only.

    --custom-rm-path dressage.reward.custom_rm.custom_rm

slime awaits ``custom_rm(args, sample)`` for one sample, and ``custom_rm(args, samples)`` with
``--group-rm`` or when a custom generate returned a list (docs/slime.md §2); it assigns
what comes back to the samples, so a list comes back as a list of the same shape. Only a
trajectory's anchor (its last segment) is scored; a sibling returns its ``0.0`` placeholder.
ABORTED samples and trajectories marked no-grad (mark_aborted_no_grad) keep their reward.
A sample's task (``metadata["task"]``, ``metadata["rm_type"]`` or ``--rm-type``) picks the
reward function; the run's ``reward_modules`` are imported first so that they register.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from typing import Any

from dressage.reward.registry import get_reward, load_reward_modules, reward_modules, task_name
from dressage.slime.sample_meta import NO_GRAD_REASON, NUM_SEGMENTS, SEGMENT_INDEX, describe
from dressage.types import Sample

__all__ = ["custom_rm", "is_scored"]

Reward = float | dict[str, Any] | None


async def custom_rm(args: Any, sample_or_samples: Any, **kwargs: Any) -> Any:
    """The reward of a sample, or the rewards of a (nested) list of samples, in its shape."""
    load_reward_modules(reward_modules(args))
    return await _score(args, sample_or_samples)


async def _score(args: Any, item: Any) -> Any:
    if isinstance(item, list):
        return list(await asyncio.gather(*(_score(args, x) for x in item)))
    return await _score_one(args, item)


def _is_sibling(sample: Sample) -> bool:
    meta = sample.metadata
    return NUM_SEGMENTS in meta and meta.get(SEGMENT_INDEX) != meta[NUM_SEGMENTS] - 1


def is_scored(sample: Sample) -> bool:
    """Anchors are scored, unless ABORTED (to be resumed) or marked no-grad."""
    if _is_sibling(sample):
        return False
    return sample.status != Sample.Status.ABORTED and NO_GRAD_REASON not in sample.metadata


async def _score_one(args: Any, sample: Sample) -> Reward:
    if _is_sibling(sample):
        return 0.0 if sample.reward is None else sample.reward
    if not is_scored(sample):
        return sample.reward
    task = task_name(args, sample)
    result = get_reward(task)(args, sample)
    if inspect.isawaitable(result):
        result = await result
    return _checked(result, sample, task)


def _checked(result: Any, sample: Sample, task: str) -> Reward:
    if isinstance(result, dict):
        return result
    if isinstance(result, numbers.Real):
        value = float(result)
        if math.isfinite(value):
            return value
    raise TypeError(
        f"{describe(sample)} field=reward: task {task!r} returned {result!r}; a reward must "
        "be a finite number or a dict"
    )
