"""Policy losses with slime's semantics, as tensor math and as slime-convention hooks.

Math (per token, flat ``[N]`` tensors over the micro-batch's response tokens, nats):

* :func:`ppo_clip_losses`: ``max(-r A, -clip(r, 1-eps, 1+eps_high) A)``; with dual clip
  (``eps_clip_c``) negative-advantage tokens are further capped at ``-eps_clip_c * A``.
  ``r = exp(log_probs - old_log_probs)``.
* :func:`gspo_log_ratio`: GSPO's sequence-level ratio: each sample's masked mean of
  ``log_probs - old_log_probs`` broadcast to its tokens; the same clip then applies.
* :func:`cispo_losses`: CISPO: ``-sg(min(r, 1+eps_high)) * A * log_probs`` (the importance weight
  is truncated from above and carries no gradient; every token keeps its gradient).
* :func:`approx_kl`: k1, k2, k3/low_var_kl estimators of KL(pi || pi_ref).

Hooks, called as ``fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``:
``dressage.training.losses.policy_loss`` (``--loss-type policy_loss`` in the embedded trainer) and
``dressage.training.losses.sft_loss``. On a cluster slime runs its own policy loss; these exist
so the embedded trainer computes the same thing. Metric names follow slime's (``pg_loss``,
``pg_clipfrac``, ``ppo_kl``, ``entropy_loss``, ``kl_loss``, ``train_rollout_logprob_abs_diff``);
each metric is reduced with ``sum_of_sample_mean`` like the loss.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dressage.slime.train_args import policy_loss_args
from dressage.training.log_probs import log_prob_function
from dressage.training.reducer import Reducer

__all__ = [
    "approx_kl",
    "cispo_losses",
    "gspo_log_ratio",
    "policy_loss",
    "ppo_clip_losses",
    "sft_loss",
]


def ppo_clip_losses(
    log_ratio: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate per token.

    Args:
        log_ratio: ``[N]`` ``log pi - log pi_old`` (differentiable).
        advantages: ``[N]``, no gradient.
        eps_clip / eps_clip_high: lower / upper clip range (upper defaults to lower).
        eps_clip_c: dual-clip constant (> 1) or None.

    Returns:
        ``(losses, clipped)``: ``[N]`` per-token loss and ``[N]`` float 0/1 marking tokens where
        the clipped term won (slime's ``pg_clipfrac`` numerator).
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = log_ratio.exp()
    unclipped = -ratio * advantages
    clipped_term = -ratio.clamp(1.0 - eps_clip, 1.0 + high) * advantages
    losses = torch.maximum(unclipped, clipped_term)
    clipped = (clipped_term > unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c must be > 1 for dual clip, got {eps_clip_c}")
        capped = torch.minimum(losses, -eps_clip_c * advantages)
        losses = torch.where(advantages < 0, capped, losses)
    return losses, clipped


def gspo_log_ratio(
    log_probs: Sequence[Tensor], old_log_probs: Sequence[Tensor], loss_masks: Sequence[Tensor]
) -> Tensor:
    """GSPO's per-sample log-ratio (masked mean over the sample) broadcast to tokens, ``[N]``."""
    parts = []
    for new, old, mask in zip(log_probs, old_log_probs, loss_masks, strict=True):
        m = mask.to(new.dtype)
        seq = ((new - old) * m).sum() / m.sum().clamp_min(1.0)
        parts.append(seq.expand(new.numel()))
    return torch.cat(parts) if parts else torch.zeros(0)


def cispo_losses(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, *, eps_clip_high: float
) -> tuple[Tensor, Tensor]:
    """CISPO per token: ``-sg(min(r, 1 + eps_high)) * A * log_probs``; returns (losses, clipped)."""
    ratio = (log_probs - old_log_probs).detach().exp()
    clipped = (ratio > 1.0 + eps_clip_high).float()
    weight = ratio.clamp(max=1.0 + eps_clip_high)
    return -weight * advantages * log_probs, clipped


def approx_kl(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimator of KL(pi || pi_ref) from sampled-token log-probs, ``[N]``."""
    log_ratio = log_probs - ref_log_probs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        # exp(-x) - 1 + x >= 0 with x = log pi - log pi_ref; low_var_kl also bounds it.
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
        return kl.clamp(-10.0, 10.0) if kind == "low_var_kl" else kl
    raise ValueError(f"unknown kl_loss_type {kind!r}; expected k1, k2, k3 or low_var_kl")


def _flat(values: Sequence[Tensor] | Tensor | None, key: str, device: torch.device) -> Tensor:
    if values is None:
        raise KeyError(f"loss batch has no {key!r}; the trainer must provide it for this loss")
    if isinstance(values, Tensor):
        return values.reshape(-1).to(device)
    return torch.cat([torch.as_tensor(v).reshape(-1) for v in values]).to(device)


def _old_log_probs(args: Namespace, batch: Mapping[str, Any], device: torch.device) -> Tensor:
    if policy_loss_args(args).use_rollout_logprobs:
        return _flat(batch.get("rollout_log_probs"), "rollout_log_probs", device).float()
    return _flat(batch.get("log_probs"), "log_probs", device).float()


def policy_loss(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, sum_of_sample_mean: Reducer
) -> tuple[Tensor, dict[str, Tensor]]:
    """slime's policy loss for ``--advantage-estimator`` grpo/gspo/cispo/reinforce_plus_plus*.

    Reads ``args`` through :func:`dressage.slime.train_args.policy_loss_args`:
    advantage_estimator, eps_clip, eps_clip_high, eps_clip_c, entropy_coef, use_kl_loss,
    kl_loss_coef, kl_loss_type, use_rollout_logprobs. ``batch`` carries slime's
    loss keys (``log_probs``, ``advantages``, ``loss_masks``, ``ref_log_probs``,
    ``rollout_log_probs``, ...; lists of ``[R_i]`` tensors).
    """
    view = policy_loss_args(args)
    if view.use_tis or view.use_opsm:
        raise NotImplementedError("TIS/OPSM are not implemented in dressage's policy loss")
    estimator = view.advantage_estimator
    entropy_coef = view.entropy_coef
    log_probs_list, entropy = log_prob_function(args)(args, batch, logits, with_entropy=True)
    log_probs = torch.cat(log_probs_list)
    device = log_probs.device
    old = _old_log_probs(args, batch, device)
    advantages = _flat(batch.get("advantages"), "advantages", device).float().detach()
    eps = view.eps_clip
    eps_high = eps if view.eps_clip_high is None else view.eps_clip_high

    if estimator == "cispo":
        pg, clipped = cispo_losses(log_probs, old, advantages, eps_clip_high=eps_high)
        log_ratio = log_probs - old
    else:
        if estimator == "gspo":
            old_list = list(old.split([int(r) for r in batch["response_lengths"]]))
            log_ratio = gspo_log_ratio(log_probs_list, old_list, batch["loss_masks"])
        else:
            log_ratio = log_probs - old
        pg, clipped = ppo_clip_losses(
            log_ratio,
            advantages,
            eps_clip=eps,
            eps_clip_high=eps_high,
            eps_clip_c=view.eps_clip_c,
        )
    pg_loss = sum_of_sample_mean(pg)
    ent = torch.cat(entropy) if entropy else log_probs.new_zeros(log_probs.shape)
    entropy_loss = sum_of_sample_mean(ent)
    loss = pg_loss - entropy_coef * entropy_loss if entropy_coef else pg_loss
    metrics = {
        "pg_loss": pg_loss.detach(),
        "pg_clipfrac": sum_of_sample_mean(clipped).detach(),
        "ppo_kl": sum_of_sample_mean(-log_ratio.detach()),
        "entropy_loss": entropy_loss.detach(),
    }
    if view.use_kl_loss:
        ref = _flat(batch.get("ref_log_probs"), "ref_log_probs", device).float()
        kl_loss = sum_of_sample_mean(approx_kl(log_probs, ref, view.kl_loss_type))
        loss = loss + view.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    if batch.get("rollout_log_probs") is not None:
        rollout = _flat(batch["rollout_log_probs"], "rollout_log_probs", device).float()
        diff = (log_probs.detach() - rollout).abs()
        metrics["train_rollout_logprob_abs_diff"] = sum_of_sample_mean(diff)
    metrics["loss"] = loss.detach()
    return loss, metrics


def sft_loss(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, sum_of_sample_mean: Reducer
) -> tuple[Tensor, dict[str, Tensor]]:
    """Negative log-likelihood of the masked response tokens (``--loss-type sft_loss``)."""
    log_probs_list, _ = log_prob_function(args)(args, batch, logits, with_entropy=False)
    loss = -sum_of_sample_mean(torch.cat(log_probs_list))
    return loss, {"loss": loss.detach()}
