"""The loss hooks under slime's Megatron backend: slime's own log-prob path and CP-local views.

Inside slime's Megatron actor a loss hook receives **vocab-parallel** logits (``V / TP`` columns
per tensor-parallel rank) of the rank's **context-parallel slice** of each packed sequence
(docs/slime.md §3.4). A plain full-vocabulary ``log_softmax`` is wrong there on both counts,
so whenever Megatron's parallel state is up, :func:`dressage.training.log_probs.log_prob_function`
hands the hooks :func:`slime_response_log_probs`, which is slime's own
``get_log_probs_and_entropy`` (TP all-reduces, CP offsets, top-p replay masks) with the
signature of :func:`dressage.training.log_probs.response_log_probs`. Per-sample response
tensors that slime keeps whole (``loss_masks``) are cut to the rank's CP slice with
:func:`cp_local`, so they line up with the CP-local log-probs slime produces.

Nothing here imports slime or Megatron at module import; off Megatron (the embedded trainer,
unit tests) every function is the identity or is never called.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

__all__ = [
    "cp_local",
    "cp_rank",
    "cp_world_size",
    "data_parallel_group",
    "local_response_rows",
    "megatron_active",
    "slime_response_log_probs",
    "tensor_parallel_shard",
]


def megatron_active() -> bool:
    """True inside a process whose Megatron model-parallel state is initialised."""
    state = sys.modules.get("megatron.core.parallel_state")
    if state is None:  # never imported: no Megatron model runs in this process
        return False
    return bool(state.model_parallel_is_initialized())


def cp_world_size() -> int:
    """The context-parallel width (1 off Megatron)."""
    if not megatron_active():
        return 1
    from megatron.core import mpu

    return int(mpu.get_context_parallel_world_size())


def cp_rank() -> int:
    """This rank's context-parallel rank (0 off Megatron)."""
    if not megatron_active():
        return 0
    from megatron.core import mpu

    return int(mpu.get_context_parallel_rank())


def data_parallel_group() -> tuple[Any, bool]:
    """``(group, is_writer)``: the data-parallel group *with* context parallelism (every rank of
    it holds a distinct share of the step's tokens), and whether this rank is the one that logs
    (first rank of that group, tensor rank 0, last pipeline stage)."""
    from megatron.core import mpu

    group = mpu.get_data_parallel_group(with_context_parallel=True)
    writer = (
        mpu.get_data_parallel_rank(with_context_parallel=True) == 0
        and mpu.get_tensor_model_parallel_rank() == 0
        and mpu.is_pipeline_last_stage()
    )
    return group, writer


def cp_local(
    values: Sequence[Tensor], total_lengths: Sequence[int], response_lengths: Sequence[int]
) -> list[Tensor]:
    """Each sample's whole ``[R_i]`` response tensor cut to this rank's CP slice (slime's
    ``slice_log_prob_with_cp``); unchanged at CP 1."""
    if cp_world_size() == 1:
        return list(values)
    from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

    return [
        slice_log_prob_with_cp(v, int(total), int(resp))
        for v, total, resp in zip(values, total_lengths, response_lengths, strict=True)
    ]


def local_response_rows(
    total_lengths: Sequence[int], response_lengths: Sequence[int]
) -> list[Tensor]:
    """Per sample, the rows of this rank's packed logits that predict its response tokens, in
    the order of slime's CP-local response tensors (all of them at CP 1).

    slime packs each sequence as ``slice_with_cp(tokens)`` (its two zigzag chunks under context
    parallelism, the whole sequence at CP 1), one after another; the logits row of position
    ``p`` predicts token ``p + 1``. Applying that same slicing to the positions themselves says
    which rows hold which positions, so the rows follow slime's layout by construction.
    """
    import torch

    if cp_world_size() > 1:
        from slime.backends.megatron_utils.cp_utils import slice_with_cp

        def held(total: int) -> Tensor:
            return slice_with_cp(torch.arange(total), -1)
    else:

        def held(total: int) -> Tensor:
            return torch.arange(total)

    out, base = [], 0
    for i, (total, resp) in enumerate(zip(total_lengths, response_lengths, strict=True)):
        total, resp = int(total), int(resp)
        if not 0 <= resp < total:
            raise ValueError(
                f"sample {i}: response_length {resp} must be in [0, total_length {total})"
            )
        positions = held(total)
        first = total - resp - 1  # the row that predicts the first response token
        (local,) = torch.nonzero((positions >= first) & (positions < total - 1), as_tuple=True)
        out.append(local + base)
        base += int(positions.numel())
    return out


def tensor_parallel_shard(width: int) -> tuple[Any, int]:
    """``(group, vocab_start)`` of this rank's vocab-parallel logits of ``width`` columns:
    Megatron's tensor-parallel group (None at TP 1 and off Megatron) and its first column."""
    if not megatron_active():
        return None, 0
    from megatron.core import mpu

    world = int(mpu.get_tensor_model_parallel_world_size())
    if world == 1:
        return None, 0
    return mpu.get_tensor_model_parallel_group(), int(mpu.get_tensor_model_parallel_rank()) * width


def slime_response_log_probs(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, with_entropy: bool = False
) -> tuple[list[Tensor], list[Tensor] | None]:
    """slime's ``get_log_probs_and_entropy`` on a loss batch: per-sample CP-local response
    log-probs (and entropies), differentiable in the vocab-parallel ``logits`` ``[1, T, V/TP]``.

    Top-p replay sets (``--rollout-top-p`` < 1) are applied as slime's own policy loss applies
    them.
    """
    from slime.backends.megatron_utils.loss import (
        get_log_probs_and_entropy,
        get_rollout_top_p_logprob_kwargs,
    )

    _, out = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
        with_entropy=with_entropy,
        **get_rollout_top_p_logprob_kwargs(args, batch),
    )
    return list(out["log_probs"]), (list(out["entropy"]) if with_entropy else None)
