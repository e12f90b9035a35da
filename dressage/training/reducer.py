"""slime's loss reducer for one rank without context parallelism.

A loss hook receives ``sum_of_sample_mean``, a function that folds a flat per-token tensor into
a scalar. This module builds it with the semantics of slime's ``get_sum_of_sample_mean``
(docs/slime.md §3.4):

* default mode: ``sum_i (sum_t x_it * mask_it) / max(denom_i, 1)``, where ``denom_i`` is the
  sample's ``rollout_mask_sums`` entry (the trainable-token count of its whole rollout, or the
  prompt-equal denominator written by the converter), falling back to the sample's own mask sum
  when no denominators are given. Siblings of one rollout therefore add up to one token-mean per
  rollout even when they land in different micro-batches.
* ``calculate_per_token_loss``: a plain masked token sum; the trainer divides by the step's token
  count instead.

The trainer then scales every micro-batch's loss by ``1 / G`` (G = rollouts per step), so the
step's gradient is ``(1/G) * sum over rollouts of each rollout's token-mean loss``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["Reducer", "get_sum_of_sample_mean", "per_sample_weights"]

Reducer = Callable[[Tensor], Tensor]


def per_sample_weights(
    loss_masks: Sequence[Tensor],
    sample_denoms: Tensor | Sequence[float] | None = None,
    *,
    calculate_per_token_loss: bool = False,
) -> Tensor:
    """Per-sample factor that multiplies each sample's masked token sum, shape ``[n_samples]``.

    ``1 / max(denom_i, 1)`` in default mode (denom = ``sample_denoms[i]`` or the sample's own
    mask sum), ``1`` with ``calculate_per_token_loss``. float32, on the masks' device.
    """
    n = len(loss_masks)
    device = loss_masks[0].device if n else torch.device("cpu")
    if calculate_per_token_loss:
        return torch.ones(n, dtype=torch.float32, device=device)
    if sample_denoms is None:
        denoms = torch.stack([m.float().sum() for m in loss_masks]) if n else torch.zeros(0)
    else:
        denoms = torch.as_tensor(sample_denoms, dtype=torch.float32)
        if denoms.numel() != n:
            raise ValueError(
                f"rollout_mask_sums has {denoms.numel()} entries for {n} samples in the micro-batch"
            )
    return 1.0 / denoms.to(device=device, dtype=torch.float32).clamp_min(1.0)


def get_sum_of_sample_mean(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor],
    sample_denoms: Tensor | Sequence[float] | None = None,
    calculate_per_token_loss: bool = False,
) -> Reducer:
    """Build the reducer a loss hook receives as ``sum_of_sample_mean``.

    Args:
        total_lengths: tokens per sample (prompt + response); kept for slime's signature, only
            context parallelism would need it.
        response_lengths: response tokens per sample, ``R_i``.
        loss_masks: per-sample masks, each ``[R_i]`` (int or float, 0/1).
        sample_denoms: ``rollout_mask_sums`` of these samples, ``[n_samples]``, or None.
        calculate_per_token_loss: masked token sum instead of the per-sample mean.

    Returns:
        ``reduce(x) -> scalar`` for ``x`` of shape ``[sum_i R_i]`` (samples concatenated in
        micro-batch order); differentiable in ``x``.
    """
    if len(total_lengths) != len(response_lengths) or len(loss_masks) != len(response_lengths):
        raise ValueError(
            f"reducer inputs disagree: {len(total_lengths)} total_lengths, "
            f"{len(response_lengths)} response_lengths, {len(loss_masks)} loss_masks"
        )
    for i, (mask, length) in enumerate(zip(loss_masks, response_lengths, strict=True)):
        if mask.numel() != length:
            raise ValueError(f"sample {i}: loss mask has {mask.numel()} entries, response {length}")
    weights = per_sample_weights(
        loss_masks, sample_denoms, calculate_per_token_loss=calculate_per_token_loss
    )
    if loss_masks:
        # One token-level weight vector: mask_it / max(denom_i, 1), so the reduction is one dot.
        token_weights = torch.cat(
            [m.to(torch.float32) * w for m, w in zip(loss_masks, weights, strict=True)]
        )
    else:
        token_weights = torch.zeros(0)
    expected = int(sum(response_lengths))

    def sum_of_sample_mean(x: Tensor) -> Tensor:
        if x.numel() != expected:
            raise ValueError(f"reducer got {x.numel()} token values for {expected} response tokens")
        w = token_weights.to(device=x.device)
        return (x.reshape(-1).to(torch.float32) * w).sum()

    return sum_of_sample_mean
