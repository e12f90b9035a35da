"""Metric plumbing shared by the loss hooks, the advantage hook and the trainers.

Naming: loss hooks return bare keys (``pg_loss``, ``mopd_loss``); trainers log them under
``train/``. Per-teacher MOPD statistics are computed where teacher ids are visible (the advantage
hook: slime forwards the ``prompt`` slot, which carries ``teacher_id``, to the DP-local
``rollout_data`` but not into the loss batch). The hook stores them in ``rollout_data`` as 0-d
tensors under ``mopd/...`` keys, to be logged as ``rollout/mopd/...``: a trainer takes them out
with :func:`pop_rollout_metrics` and logs them itself (the embedded trainer does; slime's actor
cannot: its per-key rollout logging runs right after the hook, and its DP gather expects every
rank to carry the same keys, which a teacher absent from one rank would break). So under slime
(``args.mopd_defer_rollout_metrics``, set by ``dressage.training.mopd_actor``) the hook leaves
``rollout_data`` alone and accumulates (numerator, denominator) pairs per teacher in this
process (:func:`deferred_sums`); the actor combines them over the data-parallel group after the
step and logs exact means.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ROLLOUT_METRIC_PREFIX",
    "deferred_store",
    "deferred_sums",
    "means_of",
    "mopd_teacher_metrics",
    "pop_rollout_metrics",
]

ROLLOUT_METRIC_PREFIX = "mopd/"


def pop_rollout_metrics(rollout_data: MutableMapping[str, Any]) -> dict[str, float]:
    """Remove the ``mopd/...`` entries from ``rollout_data``, returned as ``rollout/mopd/...``."""
    keys = [k for k in rollout_data if isinstance(k, str) and k.startswith(ROLLOUT_METRIC_PREFIX)]
    return {
        f"rollout/{k}": float(torch.as_tensor(rollout_data.pop(k)).float().item()) for k in keys
    }


def _trajectory_rewards(
    rollout_ids: Sequence[int], raw_rewards: Sequence[float | None] | None
) -> dict[int, float]:
    # Only the anchor carries the environment reward; its siblings hold 0.0 or None (the MOPD
    # converter writes 0.0). The largest-magnitude value per rollout is therefore the anchor's,
    # whatever order the DP partition put the samples in.
    rewards: dict[int, float] = {}
    if raw_rewards is None:
        return rewards
    for rid, value in zip(rollout_ids, raw_rewards, strict=True):
        if value is not None and (int(rid) not in rewards or abs(value) > abs(rewards[int(rid)])):
            rewards[int(rid)] = float(value)
    return rewards


def mopd_teacher_metrics(
    *,
    teacher_ids: Sequence[str],
    rollout_ids: Sequence[int],
    loss_masks: Sequence[Tensor],
    sample_denoms: Sequence[float] | Tensor,
    trainable_tokens: Sequence[float] | None = None,
    reverse_kl: Sequence[Tensor],
    raw_rewards: Sequence[float | None] | None,
    sums_out: dict[str, tuple[float, float]] | None = None,
) -> dict[str, float]:
    """Per-teacher rollout statistics, keyed ``mopd/<name>/<teacher_id>``.

    ``sums_out``, when given, accumulates each statistic's (numerator, denominator), so that
    shards of a batch (data-parallel ranks) combine exactly (:func:`means_of`).

    Args:
        teacher_ids / rollout_ids: one per sample.
        loss_masks: ``[R_i]`` per sample, aligned with ``reverse_kl`` (under context
            parallelism both are this rank's slice, so sums add up over the CP group).
        sample_denoms: ``rollout_mask_sums``, ``[n]``.
        trainable_tokens: each sample's whole trainable-token count (which trajectories count
            for the reward mean); default the sums of ``loss_masks``.
        reverse_kl: per sample ``[R_i]``, ``log pi_student_old - log pi_teacher`` on the sampled
            tokens.
        raw_rewards: environment reward per sample (None for siblings), or None if absent.

    Returns:
        ``raw_reward_trainable_trajectory_mean/<t>``: mean environment reward over teacher ``t``'s
        trajectories that have at least one trainable token (logged only; nothing trains on it).
        ``opd_reverse_kl_train_aggregation_mean/<t>``: the reverse KL averaged with exactly the
        training weights (token ``mask / max(denom, 1)``), i.e. the mean over rollouts of each
        rollout's token-mean when denominators are rollout token counts.
    """
    denoms = torch.as_tensor(sample_denoms, dtype=torch.float64).reshape(-1).clamp_min(1.0)
    rewards = _trajectory_rewards(rollout_ids, raw_rewards)
    kl_num: dict[str, float] = {}
    kl_den: dict[str, float] = {}
    trainable: dict[str, set[int]] = {}
    for i, tid in enumerate(teacher_ids):
        mask = loss_masks[i].double().cpu()
        tokens = float(mask.sum())
        weight = 1.0 / float(denoms[i])
        kl_num[tid] = (
            kl_num.get(tid, 0.0) + float((reverse_kl[i].double().cpu() * mask).sum()) * weight
        )
        kl_den[tid] = kl_den.get(tid, 0.0) + tokens * weight
        if (tokens if trainable_tokens is None else trainable_tokens[i]) > 0:
            trainable.setdefault(tid, set()).add(int(rollout_ids[i]))
    sums: dict[str, tuple[float, float]] = {}
    for tid in kl_num:
        sums[f"mopd/opd_reverse_kl_train_aggregation_mean/{tid}"] = (kl_num[tid], kl_den[tid])
        rewarded = [rewards[r] for r in sorted(trainable.get(tid, set())) if r in rewards]
        sums[f"mopd/raw_reward_trainable_trajectory_mean/{tid}"] = (
            sum(rewarded),
            float(len(rewarded)),
        )
    if sums_out is not None:
        for key, (num, den) in sums.items():
            old_num, old_den = sums_out.get(key, (0.0, 0.0))
            sums_out[key] = (old_num + num, old_den + den)
    return means_of(sums)


def means_of(sums: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """``{key: numerator / denominator}`` for the keys whose denominator is positive."""
    return {key: num / den for key, (num, den) in sums.items() if den > 0}


_DEFERRED: dict[str, tuple[float, float]] = {}
"""Per-teacher (numerator, denominator) pairs held back from ``rollout_data`` (see
:func:`defer_rollout_metrics`)."""


def deferred_store() -> dict[str, tuple[float, float]]:
    """Where the advantage hook accumulates deferred sums (``sums_out``) in this process."""
    return _DEFERRED


def deferred_sums() -> dict[str, tuple[float, float]]:
    """Take the sums the advantage hook deferred in this process since the last call."""
    out = dict(_DEFERRED)
    _DEFERRED.clear()
    return out
