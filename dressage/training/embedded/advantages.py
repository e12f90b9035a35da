"""Advantages and returns as slime's ``compute_advantages_and_returns`` computes them, one rank.

Order (docs/slime.md §4.2): per-token ``kl`` (from the reference log-probs when
``kl_coef != 0``, which then must exist, else zeros) is stored first; then the custom
advantage hook (``fn(args, rollout_data)``) or the built-in estimator; then ``--use-opd`` KL
shaping; then ``--normalize-advantages`` whitening (unbiased variance, as slime's). The
REINFORCE++ estimators need whitening, as slime's parser says. tests/real_slime/
test_embedded_parity.py runs this and slime's own function on the same batches.

Estimators: ``grpo``/``gspo``/``cispo`` broadcast the post-processed scalar reward to every
response token; ``reinforce_plus_plus_baseline`` does the same minus ``kl_coef * kl``;
``reinforce_plus_plus`` puts the reward on the last trainable token, adds ``-kl_coef * kl`` per
token and discounts with ``gamma``. ``ppo`` needs a critic, which the embedded trainer lacks.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import MutableMapping
from typing import Any

import torch
from torch import Tensor

from dressage.slime.hooks import load_function
from dressage.slime.train_args import advantage_args
from dressage.training.losses import approx_kl

__all__ = ["compute_advantages_and_returns", "masked_whiten"]

_BROADCAST = ("grpo", "gspo", "cispo")
_NEED_WHITENING = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


def masked_whiten(values: list[Tensor], masks: list[Tensor], eps: float = 1e-8) -> list[Tensor]:
    """``(v - mean) / sqrt(var + eps)`` over all masked tokens of all samples, the variance
    unbiased (Bessel) as slime's ``distributed_masked_whiten`` takes it."""
    flat = torch.cat(values)
    mask = torch.cat(masks).to(flat.dtype)
    count = mask.sum()
    if count.item() == 0:
        raise ValueError("--normalize-advantages: the batch has no trainable token")
    mean = (flat * mask).sum() / count
    var = ((flat - mean).square() * mask).sum() / count
    if count.item() >= 2:
        var = var * count / (count - 1)
    scale = torch.rsqrt(var + eps)
    return [(v - mean) * scale for v in values]


def _rewards(rollout_data: MutableMapping[str, Any], n: int) -> list[float]:
    rewards = rollout_data.get("rewards")
    if rewards is None or len(rewards) != n:
        raise KeyError("the built-in estimators need rollout_data['rewards'], one per sample")
    return [float(r) for r in rewards]


def _discounted(rewards: Tensor, gamma: float) -> Tensor:
    out = torch.zeros_like(rewards)
    running = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    for t in range(rewards.numel() - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def compute_advantages_and_returns(args: Namespace, rollout_data: MutableMapping[str, Any]) -> None:
    """Set ``kl``, ``advantages`` and ``returns`` (lists of ``[R_i]`` float32 tensors)."""
    view = advantage_args(args)
    log_probs: list[Tensor] = rollout_data[view.student_key]
    masks: list[Tensor] = rollout_data["loss_masks"]
    kl_coef = view.kl_coef
    ref = rollout_data.get("ref_log_probs")
    if kl_coef != 0.0:
        if ref is None:  # slime loads a reference model whenever --kl-coef is set
            raise KeyError("--kl-coef != 0 needs rollout_data['ref_log_probs'] (a reference)")
        kl = [approx_kl(lp, r, view.kl_loss_type) for lp, r in zip(log_probs, ref, strict=True)]
    else:
        kl = [torch.zeros_like(lp) for lp in log_probs]
    rollout_data["kl"] = kl

    estimator = view.advantage_estimator
    custom = view.custom_advantage_function_path
    if estimator in _NEED_WHITENING and not view.normalize_advantages:
        raise ValueError(f"{estimator} requires --normalize-advantages (as slime's parser)")
    if custom:
        load_function(custom)(args, rollout_data)
    elif estimator in _BROADCAST or estimator == "reinforce_plus_plus_baseline":
        rewards = _rewards(rollout_data, len(log_probs))
        adv = [torch.full_like(lp, r) for lp, r in zip(log_probs, rewards, strict=True)]
        if estimator == "reinforce_plus_plus_baseline":
            adv = [a - kl_coef * k for a, k in zip(adv, kl, strict=True)]
        # slime's rppb returns *are* its advantage list, so OPD shaping (below) reaches both
        returns = adv if estimator == "reinforce_plus_plus_baseline" else [a.clone() for a in adv]
        rollout_data["advantages"], rollout_data["returns"] = adv, returns
    elif estimator == "reinforce_plus_plus":
        rewards = _rewards(rollout_data, len(log_probs))
        returns = []
        for i, (m, k, r) in enumerate(zip(masks, kl, rewards, strict=True)):
            token_rewards = -kl_coef * k * m.to(k.dtype)
            trainable = torch.nonzero(m).flatten()
            if not trainable.numel():  # slime asserts the same: the return has no last token
                raise ValueError(f"reinforce_plus_plus: sample {i} has no trainable token")
            token_rewards[int(trainable[-1])] += r
            returns.append(_discounted(token_rewards, view.gamma))
        rollout_data["advantages"], rollout_data["returns"] = returns, [x.clone() for x in returns]
    elif estimator == "ppo":
        raise NotImplementedError(
            "advantage_estimator 'ppo' needs a critic; the embedded trainer has none"
        )
    else:
        raise ValueError(
            f"unknown advantage_estimator {estimator!r} and no --custom-advantage-function-path"
        )
    if "advantages" not in rollout_data or "returns" not in rollout_data:
        raise KeyError(f"advantage hook {custom!r} did not set 'advantages' and 'returns'")

    if view.use_opd:
        teacher = rollout_data.get("teacher_log_probs")
        if teacher is None:
            raise KeyError("--use-opd needs rollout_data['teacher_log_probs']")
        coef = view.opd_kl_coef
        advantages = rollout_data["advantages"]
        for i, (s, t) in enumerate(zip(log_probs, teacher, strict=True)):  # in place, as slime
            advantages[i] = advantages[i] - coef * (s - t)
    if view.normalize_advantages:
        rollout_data["advantages"] = masked_whiten(rollout_data["advantages"], masks)
