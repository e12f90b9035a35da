"""slime-shaped train_data dicts and tiny models for the training tests."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

MOPD_HOOKS = {
    "custom_advantage_function_path": "dressage.training.mopd_loss.compute_mopd_advantages",
    "loss_type": "custom_loss",
    "custom_loss_function_path": "dressage.training.mopd_loss.mopd_policy_loss",
}


def train_data(
    lengths: Sequence[tuple[int, int]],
    *,
    rollout_ids: Sequence[int] | None = None,
    teacher_ids: Sequence[str] | None = None,
    rewards: Sequence[float] | None = None,
    masks: Sequence[Sequence[int]] | None = None,
    tokens: Sequence[Sequence[int]] | None = None,
    seed: int = 0,
    vocab: int = 5000,
) -> dict[str, Any]:
    """train_data as convert_samples_to_train_data emits it (slime's keys, plain lists).

    ``lengths``: (prompt, response) tokens per sample. ``rollout_mask_sums`` is slime's default:
    the summed loss mask of the sample's rollout.
    """
    gen = torch.Generator().manual_seed(seed)
    n = len(lengths)
    rids = list(rollout_ids) if rollout_ids is not None else list(range(n))
    if tokens is None:
        tokens = [torch.randint(0, vocab, (p + r,), generator=gen).tolist() for p, r in lengths]
    loss_masks = [list(m) for m in masks] if masks is not None else [[1] * r for _, r in lengths]
    per_rollout: dict[int, int] = {}
    for rid, mask in zip(rids, loss_masks, strict=True):
        per_rollout[rid] = per_rollout.get(rid, 0) + sum(mask)
    data: dict[str, Any] = {
        "tokens": [list(t) for t in tokens],
        "response_lengths": [r for _, r in lengths],
        "rewards": list(rewards) if rewards is not None else [0.0] * n,
        "raw_reward": list(rewards) if rewards is not None else [0.0] * n,
        "truncated": [0] * n,
        "sample_indices": list(range(n)),
        "rollout_ids": rids,
        "loss_masks": loss_masks,
        "rollout_mask_sums": [float(per_rollout[r]) for r in rids],
        "rollout_log_probs": [[-1.0] * r for _, r in lengths],
        "source_names": ["tiny-set"] * n,
    }
    if teacher_ids is not None:
        data["prompt"] = list(teacher_ids)
    return data


@cache
def tiny_dir(seed: int) -> Path:
    from dressage.tiny import TinyModelSpec, tiny_model_dir

    return tiny_model_dir(TinyModelSpec(seed=seed))


def load_tiny(seed: int) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model: nn.Module = AutoModelForCausalLM.from_pretrained(str(tiny_dir(seed)))
    return model.eval()


def sample_responses(
    model: nn.Module, prompts: torch.Tensor, length: int, seed: int
) -> torch.Tensor:
    """``[B, P + length]``: prompts continued by ancestral sampling from ``model``."""
    gen = torch.Generator().manual_seed(seed)
    ids = prompts
    with torch.no_grad():
        for _ in range(length):
            probs = torch.softmax(model(ids).logits[:, -1].float(), dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return ids
