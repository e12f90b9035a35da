"""Reward post-processing for multi-segment rollouts, over a batch layout.

The work behind the reward post-process hook
(``dressage.training.reward_post_process.reward_post_process``) and the converter
(``dressage.rollout.convert_samples``), which post-processes on the layout it has already built.

slime's default (docs/slime.md §4.1) groups rewards *positionally* and falls back to one
batch-wide group as soon as the sample count is not ``n_samples_per_prompt x
rollout_batch_size``, which is always the case once trajectories split into segments. Here:

* Only anchors carry a reward (the reward hook scores anchors only); siblings hold ``0.0``
  placeholders that must not enter any statistic. One value per rollout, the anchor's.
* Groups are prompts (``group_index``, else ``metadata["instance_id"]``), not positions.
* Normalisation applies for ``grpo``, ``gspo``, ``cispo`` and ``reinforce_plus_plus_baseline``
  when ``args.rewards_normalization`` (slime's ``--disable-rewards-normalization``): subtract
  the group mean; for grpo/gspo/cispo also divide by ``std + 1e-6`` when
  ``args.grpo_std_normalization`` (forced off when ``n_samples_per_prompt == 1``). The std is
  Bessel-corrected like torch's default; a group with a single anchor gets std 0 where torch
  would return NaN, so its advantage is 0 instead of NaN. ``ppo``, ``reinforce_plus_plus`` and
  disabled normalisation keep the raw values.
* Removed anchors (``remove_sample=True``) are left out of the statistics (slime keeps them
  in; the issue asks otherwise) and get 0.0 when normalising. A removed anchor may have no
  reward (it counts as 0.0).
* The anchor's post-processed value is broadcast to all its siblings for every estimator.
  A plain slime rollout of several samples (siblings by ``rollout_id`` without segment keys,
  dressage.slime.layout) is anchored at its last sample; slime's producers give every
  sibling the trajectory's reward, so only the anchor's is read.
* ``raw`` stays sparse: the anchor's raw reward, 0.0 for its siblings.

Arithmetic is float64 (slime's default uses float32 tensors; the values agree to ~1e-6).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from dressage.slime.args import SlimeArgs
from dressage.slime.layout import BatchLayout, SampleColumns
from dressage.slime.sample_meta import describe
from dressage.types import Sample

__all__ = ["STD_EPS", "post_process_rewards", "reward_value"]

STD_EPS = 1e-6


def post_process_rewards(
    view: SlimeArgs,
    samples: Sequence[Sample],
    layout: BatchLayout,
    *,
    columns: SampleColumns | None = None,
) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)`` of the flat batch ``samples`` on its already built layout.

    ``columns`` (the converter's ``read_columns(samples)``) saves a pass over the anchors.
    """
    anchors = layout.anchors
    positions = anchors.tolist()
    if columns is None:
        anchor_samples = [samples[a] for a in positions]
        removed = np.array([s.remove_sample for s in anchor_samples], dtype=bool)
        rewards = [s.reward for s in anchor_samples]
    else:
        removed = np.array(columns.removed, dtype=bool)[anchors]
        rewards = [columns.rewards[a] for a in positions]
    values = _anchor_values(samples, positions, rewards, removed, view.reward_key)
    raw = np.zeros(len(samples), dtype=np.float64)
    raw[anchors] = values
    per_rollout = values
    if view.normalizes_rewards:
        assert layout.prompt_index is not None  # build_layout(need_prompts=True) guarantees it
        prompts = layout.prompt_index[anchors]
        per_rollout = _normalize(values, prompts, removed, divide_by_std=view.divides_by_std)
    rewards = per_rollout[layout.rollout_index]
    return raw.tolist(), rewards.tolist()


def _anchor_values(
    samples: Sequence[Sample],
    positions: list[int],
    rewards: list[Any],
    removed: np.ndarray,
    reward_key: str | None,
) -> np.ndarray:
    """(R,) float64 rewards of the anchors at ``positions``; finite floats take the fast path
    (which touches no sample: on a large batch each sample touched is a cache miss)."""
    if reward_key is None and set(map(type, rewards)) == {float}:
        values = np.array(rewards, dtype=np.float64)
        if np.isfinite(values).all():
            return values
    return np.array(
        [
            reward_value(samples[a], reward_key, allow_none=bool(r))
            for a, r in zip(positions, removed, strict=True)
        ],
        dtype=np.float64,
    )


def _normalize(
    values: np.ndarray, groups: np.ndarray, removed: np.ndarray, *, divide_by_std: bool
) -> np.ndarray:
    """Per-group centring (and scaling) of per-rollout ``values``; removed rollouts get 0."""
    keep = ~removed
    size = int(groups.max()) + 1
    kept_groups, kept_values = groups[keep], values[keep]
    count = np.bincount(kept_groups, minlength=size)
    mean = np.bincount(kept_groups, weights=kept_values, minlength=size) / np.maximum(count, 1)
    out = values - mean[groups]
    if divide_by_std:
        squares = np.bincount(
            kept_groups, weights=(kept_values - mean[kept_groups]) ** 2, minlength=size
        )
        std = np.sqrt(squares / np.maximum(count - 1, 1))
        out = out / (std[groups] + STD_EPS)
    out[removed] = 0.0
    return out


def reward_value(sample: Sample, reward_key: str | None, *, allow_none: bool = False) -> float:
    """The scalar reward of an anchor (``reward[reward_key]`` for dict rewards).

    Raises:
        TypeError: the reward is missing or not a number (or not a dict under a reward key).
        ValueError: the reward is NaN or infinite.
    """
    reward = sample.reward
    if reward is None and allow_none:
        return 0.0
    if reward_key:
        if not isinstance(reward, dict) or reward_key not in reward:
            raise TypeError(
                f"{describe(sample)} field=reward: --reward-key {reward_key!r} needs a dict "
                f"reward with that key, got {type(reward).__name__} {reward!r}"
            )
        reward = reward[reward_key]
    if reward is None:
        raise TypeError(
            f"{describe(sample)} field=reward: the anchor has no reward (was it scored?)"
        )
    if not isinstance(reward, numbers.Real):
        raise TypeError(
            f"{describe(sample)} field=reward: expected a number, got "
            f"{type(reward).__name__} {reward!r}"
        )
    value = float(reward)
    if not math.isfinite(value):
        raise ValueError(f"{describe(sample)} field=reward: {value!r} is not finite")
    return value
