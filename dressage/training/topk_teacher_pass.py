"""The top-k MOPD teacher pass inside slime's Megatron actor: a post-forward function for slime.

slime scores log-probs with ``forward_only(get_log_probs_and_entropy, ...)``
(``slime.backends.megatron_utils.model``): Megatron's forward-only schedule runs the model, and
the post-forward function turns each micro-batch's logits into per-sample lists that
``forward_only`` stores under ``store_prefix + key``, in sample order (put back in order under
``--use-dynamic-batch-size``). With ``--mopd-objective topk`` the MOPD actor
(:mod:`dressage.training.mopd_actor`) runs each teacher's pass as
``forward_only(log_probs_and_support, ..., store_prefix="teacher_")``:
:func:`log_probs_and_support` has ``get_log_probs_and_entropy``'s signature and returns, in the
same layout, the sampled-token log-probs under ``log_probs`` and under :data:`SUPPORT_KEYS` each
sample's top-K support (:class:`dressage.training.mopd_topk.TeacherSupport`), O(K) a position.
Both come from one pass over the logits (the sampled token's log-prob is a by-product of the
support's normaliser), so the teacher's pass costs what slime's own costs, not twice that.

The support is :func:`dressage.training.mopd_topk.teacher_support` on this rank's vocabulary
shard (``[T, V / TP]``; Megatron's tensor-parallel group and the shard's first column,
:func:`dressage.training.megatron_path.tensor_parallel_shard`) at the rows that predict the
response tokens in slime's context-parallel order
(:func:`dressage.training.megatron_path.local_response_rows`), so a sample's support covers
exactly the rank-local positions of its ``teacher_log_probs``. K is ``--mopd-topk``, the
temperature ``--rollout-temperature``. No rank holds ``[tokens, V]``.
:func:`with_supports` hangs each support on its sample's teacher log-probs tensor
(:func:`dressage.training.mopd_topk.attach_support`), which is how it reaches the loss hook.

``--allgather-cp`` (another context-parallel layout) and ``--rollout-top-p`` below 1 (slime
masks the teacher's log-probs to the rollout's nucleus, which the support would not see) are
refused (:func:`check_topk_options`).

Importing this module does not import slime.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dressage.slime.mopd_args import mopd_args
from dressage.slime.train_args import log_prob_args
from dressage.training.megatron_path import cp_local, local_response_rows, tensor_parallel_shard
from dressage.training.mopd_topk import TeacherSupport, attach_support, mopd_topk, teacher_support

__all__ = [
    "SUPPORT_KEYS",
    "check_topk_options",
    "log_probs_and_support",
    "response_supports",
    "with_supports",
]

SUPPORT_KEYS = ("topk_ids", "topk_log_probs", "topk_tail")
"""The keys :func:`log_probs_and_support` adds: per sample ``[R_i, K]`` int32 ids, ``[R_i, K]``
float32 log-probs and the ``[R_i]`` float32 tail (forward_only prefixes them)."""


def check_topk_options(args: Namespace) -> None:
    """Fail on the slime options the top-k objective cannot follow, naming them."""
    view = mopd_args(args)
    allgather_cp, top_p = view.allgather_cp, view.rollout_top_p
    if allgather_cp or top_p < 1.0:
        raise ValueError(
            f"--mopd-objective topk supports neither --allgather-cp (got {allgather_cp}) nor "
            f"--rollout-top-p below 1 (got {top_p}): its teacher support follows slime's zigzag "
            "context-parallel layout and is taken from the teacher's unmasked distribution; drop "
            "--allgather-cp and set --rollout-top-p 1, or use --mopd-objective sampled"
        )
    mopd_topk(args)  # K >= 1


def response_supports(
    logits: Tensor,
    *,
    args: Namespace,
    unconcat_tokens: Sequence[Tensor],
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
) -> tuple[list[TeacherSupport], list[Tensor]]:
    """Per sample, the teacher's top-K support and sampled-token log-probs at its rank-local
    response positions.

    Args:
        logits: ``[1, T, V / TP]`` (or ``[T, V / TP]``) this rank's packed vocabulary shard.
        unconcat_tokens: each sample's whole token sequence (``[total_i]``).

    Returns:
        ``(supports, log_probs)``: one :class:`TeacherSupport` (``[R_i]`` rows, CP-local) and
        one ``[R_i]`` float32 tensor of ``log pT(y_t)`` a sample, in slime's CP order.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    total, resp = [int(n) for n in total_lengths], [int(r) for r in response_lengths]
    rows = local_response_rows(total, resp)
    responses = [
        torch.as_tensor(t).reshape(-1)[n - r :]
        for t, n, r in zip(unconcat_tokens, total, resp, strict=True)
    ]
    targets = cp_local(responses, total, resp)
    group, start = tensor_parallel_shard(int(flat.shape[-1]))
    device = flat.device
    scoring = log_prob_args(args)
    support, target_lp = teacher_support(
        flat,
        torch.cat(rows).to(device),
        torch.cat([t.reshape(-1) for t in targets]).to(device),
        mopd_topk(args),
        temperature=scoring.rollout_temperature,
        chunk_tokens=scoring.chunk_tokens,
        group=group,
        vocab_start=start,
    )
    sizes = [int(r.numel()) for r in rows]
    supports = [
        TeacherSupport(ids, log_probs, tail)
        for ids, log_probs, tail in zip(
            support.ids.split(sizes),
            support.log_probs.split(sizes),
            support.tail.split(sizes),
            strict=True,
        )
    ]
    return supports, list(target_lp.split(sizes))


def log_probs_and_support(
    logits: Tensor,
    *,
    args: Namespace,
    unconcat_tokens: list[Tensor],
    total_lengths: list[int],
    response_lengths: list[int],
    with_entropy: bool = False,
    non_loss_data: bool = True,
    top_p_token_ids: list[list[int]] | None = None,
    top_p_token_offsets: list[list[int]] | None = None,
) -> tuple[Tensor, dict[str, list[Tensor]]]:
    """slime's ``forward_only`` post-forward function for a top-k teacher pass.

    Args:
        logits: ``[1, T, V / TP]`` float32, this rank's shard of the packed micro-batch.
        with_entropy: ignored: the teacher's entropy is never read, so it is not computed.
        top_p_token_ids, top_p_token_offsets: ignored: ``--rollout-top-p`` below 1 is refused
            (:func:`check_topk_options`), so slime passes none.

    Returns:
        As ``get_log_probs_and_entropy``, ``(empty tensor, values)`` (Megatron's schedule stores
        the second): ``log_probs`` (``[R_i]`` sampled-token log-probs, CP-local, as slime's)
        and, per sample, ``topk_ids`` ``[R_i, K]``, ``topk_log_probs`` ``[R_i, K]``,
        ``topk_tail`` ``[R_i]``.
    """
    assert non_loss_data
    check_topk_options(args)
    supports, log_probs = response_supports(
        logits,
        args=args,
        unconcat_tokens=unconcat_tokens,
        total_lengths=total_lengths,
        response_lengths=response_lengths,
    )
    ids_key, log_probs_key, tail_key = SUPPORT_KEYS
    return torch.empty((0,), device=logits.device), {
        "log_probs": log_probs,
        ids_key: [s.ids for s in supports],
        log_probs_key: [s.log_probs for s in supports],
        tail_key: [s.tail for s in supports],
    }


def with_supports(stored: Mapping[str, Any], prefix: str = "") -> list[Tensor] | None:
    """``stored[prefix + "log_probs"]`` (what ``forward_only`` returned from
    :func:`log_probs_and_support`), each sample's tensor carrying its support; None when there
    are no values (off the last pipeline stage)."""
    values = stored.get(prefix + "log_probs")
    if values is None:
        return None
    columns: list[Sequence[Tensor]] = []
    for key in SUPPORT_KEYS:
        column = stored.get(prefix + key)
        if column is None or len(column) != len(values):
            raise ValueError(
                f"the top-k teacher pass stored {len(values)} samples' log-probs but "
                f"{'no' if column is None else len(column)} {prefix + key!r}"
            )
        columns.append(column)
    ids, log_probs, tail = columns
    return [
        attach_support(value, TeacherSupport(i, lp, t))
        for value, i, lp, t in zip(values, ids, log_probs, tail, strict=True)
    ]
