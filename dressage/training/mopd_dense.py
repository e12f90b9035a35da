"""The dense MOPD objective: the exact reverse KL to the teacher over the whole vocabulary.

``--mopd-objective dense`` makes the MOPD loss hook
(:func:`dressage.training.mopd_loss.mopd_policy_loss`) minimise, at every response position
``t`` of the student's own samples::

    KL_t = sum_v pS(v | ctx_t) * (log pS(v | ctx_t) - log pT(v | ctx_t))
    L    = sum_of_sample_mean(KL_t)                       (token-mean per rollout, as slime's)

with the gradient through ``pS`` only (the teacher is frozen), both distributions at
``--rollout-temperature``. With ``mopd_forward_kl_weight`` b > 0 (a job option), each token's
term is ``(1 - b) KL_t + b sum_v pT (log pT - log pS)``: the reverse KL's gradient vanishes
where the student is sure of a token its teacher rules out, so such a mistake stays; the forward
KL's does not. On the embedded default, one of two runs ended with the student sure that
``56 + 13`` is written ``56`` then a space (the teacher: `` +``), solving no addition; 30
further steps at b = 0.5 took additions from 0% to 100%, at b = 0 they stayed at 0%.

Why dense: on the embedded default's tiny models the sampled-token loss
(``-A_t log pS(y_t)``) moves nothing, while this one moves a skill from a skilled teacher into the
student in 100-200 steps (bench/results/mopd_recipe/README.md, findings 1, 2, 6 and 11).

The loss batch must carry ``teacher_full_log_probs``: per sample the teacher's log-softmax at its
response positions, ``[R_i, V]`` float32. The embedded trainer keeps it when this objective is
selected (``sum R_i x V`` floats: cheap for the 704-row task vocabulary, not for a 248k one).
slime's Megatron actor does not produce it (its logits are vocab-parallel; a top-k gather is
future work), so :mod:`dressage.training.mopd_actor` refuses the flag at init.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dressage.config.job import MOPD_OBJECTIVES, MopdObjective
from dressage.slime.mopd_args import mopd_args
from dressage.slime.train_args import log_prob_args
from dressage.training.log_probs import chunk_rows, response_positions
from dressage.training.megatron_path import megatron_active
from dressage.training.reducer import Reducer

__all__ = ["dense_reverse_kl_loss", "mopd_objective", "reverse_kl"]


def mopd_objective(args: Namespace) -> MopdObjective:
    """``args.mopd_objective`` (None or absent: ``sampled``), checked.

    Absent means the hooks run under a slime command that never registered the MOPD flags
    (``dressage.training.mopd_train`` and the jobs always set it, by default
    :data:`dressage.config.run.DEFAULT_MOPD_OBJECTIVE`): only ``sampled`` needs nothing beyond
    slime's own teacher log-probs there."""
    value = mopd_args(args).mopd_objective
    for objective in MOPD_OBJECTIVES:
        if value == objective:
            return objective
    raise ValueError(f"--mopd-objective must be one of {', '.join(MOPD_OBJECTIVES)}; got {value!r}")


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


class _MixedKL(torch.autograd.Function):
    """``(1 - b) KL(pS || pT) + b KL(pT || pS)`` per row, ``pS = softmax(logits[rows] / T)``,
    recomputing the softmax in backward instead of storing it."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        rows: Tensor,
        teacher: Tensor,
        temperature: float,
        chunk: int,
        forward_weight: float,
    ) -> Tensor:
        out = torch.empty(rows.numel(), dtype=torch.float32, device=logits.device)
        b = forward_weight
        for s in range(0, rows.numel(), chunk):
            logp = torch.log_softmax(
                _scaled(logits.index_select(0, rows[s : s + chunk]), temperature), -1
            )
            q = teacher[s : s + chunk]
            value = (1.0 - b) * (logp.exp() * (logp - q)).sum(-1)
            if b:
                value = value + b * (q.exp() * (q - logp)).sum(-1)
            out[s : s + chunk] = value
        ctx.save_for_backward(logits, rows, teacher)
        ctx.temperature, ctx.chunk, ctx.forward_weight = temperature, chunk, b
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        logits, rows, teacher = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        t, chunk, b = ctx.temperature, ctx.chunk, ctx.forward_weight
        for s in range(0, rows.numel(), chunk):
            r = rows[s : s + chunk]
            logp = torch.log_softmax(_scaled(logits.index_select(0, r), t), -1)
            p, q = logp.exp(), teacher[s : s + chunk]
            # reverse: dKL/dz_j = p_j (log p_j - log q_j - KL); forward: p_j - q_j. The 1/T
            # comes from z = logits / T.
            part = p * (logp - q)
            part = (1.0 - b) * (part - p * part.sum(-1, keepdim=True))
            if b:
                part = part + b * (p - q.exp())
            part = part * grad_out[s : s + chunk, None].float() / t
            grad.index_copy_(0, r, part.to(grad.dtype))
        return grad, None, None, None, None, None


def reverse_kl(
    logits: Tensor,
    rows: Tensor,
    teacher_log_probs: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    forward_weight: float = 0.0,
) -> Tensor:
    """Per row ``sum_v pS (log pS - log pT)`` with ``pS = softmax(logits[rows] / T)``; with
    ``forward_weight`` b > 0, ``(1 - b)`` times that plus ``b`` times the forward KL
    ``sum_v pT (log pT - log pS)``.

    The reverse KL's gradient vanishes where the student is sure of a token the teacher rules
    out (``pS`` one-hot on ``w``: ``dKL/dz = pS (log pS - log pT - KL)`` is 0 in every
    coordinate), so such a mistake is never unlearnt; the forward KL's, ``pS - pT``, is largest
    there.

    Args:
        logits: ``[T, V]``, any float dtype; may require grad.
        rows: ``[N]`` long, distinct row indices into ``logits``.
        teacher_log_probs: ``[N, V]`` the teacher's log-softmax at those rows (no gradient).
        forward_weight: ``b`` in [0, 1].

    Returns:
        ``[N]`` float32 (nats), differentiable in ``logits``.
    """
    if not 0.0 <= forward_weight <= 1.0:
        raise ValueError(f"forward_weight must be in [0, 1], got {forward_weight}")
    teacher = teacher_log_probs.detach().float().to(logits.device)
    if teacher.shape != (rows.numel(), logits.shape[-1]):
        raise ValueError(
            f"teacher_full_log_probs {list(teacher.shape)} do not match the student's "
            f"{[rows.numel(), logits.shape[-1]]} (response positions x vocabulary)"
        )
    chunk = chunk_rows(logits.shape[-1], chunk_tokens, logits.device)
    return _MixedKL.apply(logits, rows, teacher, float(temperature), chunk, float(forward_weight))


def _packed_teacher(values: Sequence[Tensor] | Tensor | None) -> Tensor:
    if values is None:
        raise KeyError(
            "mopd_policy_loss: --mopd-objective dense needs the loss batch's "
            "'teacher_full_log_probs' (per sample the teacher's [R_i, V] log-softmax; the "
            "embedded trainer keeps it when it scores teachers)"
        )
    if isinstance(values, Tensor):
        return values
    return torch.cat([torch.as_tensor(v) for v in values])


def dense_reverse_kl_loss(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, sum_of_sample_mean: Reducer
) -> Tensor:
    """``sum_of_sample_mean`` of the per-token reverse KL (see the module docstring).

    Args:
        args: reads ``rollout_temperature`` and ``log_probs_chunk_size``.
        batch: ``total_lengths``, ``response_lengths``, ``teacher_full_log_probs``.
        logits: packed ``[1, T, V]`` as a loss hook receives them (one rank, no TP/CP).
    """
    if megatron_active():
        raise RuntimeError(
            "--mopd-objective dense is embedded-only for now: under Megatron the logits are "
            "vocab-parallel and the teacher's full distributions are not gathered"
        )
    scoring = log_prob_args(args)
    flat = logits.reshape(-1, logits.shape[-1])
    rows, _ = response_positions(
        list(batch["total_lengths"]), list(batch["response_lengths"]), device=flat.device
    )
    kl = reverse_kl(
        flat,
        rows,
        _packed_teacher(batch.get("teacher_full_log_probs")),
        temperature=scoring.rollout_temperature,
        chunk_tokens=scoring.chunk_tokens,
        forward_weight=mopd_args(args).mopd_forward_kl_weight,
    )
    return sum_of_sample_mean(kl)
