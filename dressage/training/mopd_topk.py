"""The top-k MOPD objective: the teacher's distribution kept on K tokens a position, vocab-parallel.

``--mopd-objective topk --mopd-topk K`` makes the MOPD loss hook
(:func:`dressage.training.mopd_loss.mopd_policy_loss`) minimise, at every response position
``t`` of the student's own samples, the KL between the student's and the teacher's
distributions **coarsened onto buckets**: each token of the support ``S_t`` is a bucket of its
own, and everything else is one tail bucket::

    S_t   = topK(pT(. | ctx_t))  u  {y_t}               (the teacher's K most likely, the sampled)
    p(B)  = p(v) for B = {v}, v in S_t;   p(tail) = 1 - sum_{v in S_t} p(v)
    KL_t  = sum_B pS(B) (log pS(B) - log pT(B))          (reverse; B over S_t and the tail)
    L     = sum_of_sample_mean((1 - b) KL_t + b sum_B pT(B) (log pT(B) - log pS(B)))

Both distributions are normalised over the **whole** vocabulary (``log p(v) = z_v - logsumexp
z``), not renormalised over ``S_t``; the tail's log-mass is ``logsumexp_{v not in S_t} z_v -
logsumexp z``, computed with its own maximum so that it stays finite however small it is. ``b``
is ``mopd_forward_kl_weight`` (as for ``dense``); both at ``--rollout-temperature``. The
gradient flows through ``pS`` only.

Why this form (docs/mopd_objectives.md has the derivation):

* It is the exact KL between two distributions over ``|S_t| + 1`` outcomes, so it is >= 0 and
  zero only when the student matches the teacher on every bucket; by the data-processing
  inequality it never exceeds the dense KL, and with ``K = V`` the tail is empty and it *is* the
  dense KL (:mod:`dressage.training.mopd_dense`), to float rounding.
* The tail bucket counts, exactly, the student mass the teacher's top-K does not cover: a
  student sure of a token its teacher rules out pays ``pS(tail) log(pS(tail) / pT(tail))``, as
  with the dense loss. Renormalising over ``S_t`` instead would make the loss blind to it (and
  zero at ``K = 1``).
* The sampled token ``y_t`` is in the support, where the student actually went: its teacher
  log-prob is the one the sampled objective already computes, so it costs nothing extra.

What the teacher pass keeps a position: K ids (int32), K log-probs and the tail's log-mass
(float32), O(K), never O(V) (:class:`TeacherSupport`). It rides on the sample's
``teacher_log_probs`` tensor (:func:`attach_support`): slime's train step hands the loss hook a
fixed list of batch keys, and ``teacher_log_probs`` is the one that reaches it.

**Vocab-parallel.** Every function takes the rank's logits shard ``[rows, V / TP]`` and the
tensor-parallel group: each rank takes the top-K of its own shard, one ``all_gather`` of
``K`` candidates a row picks the global top-K, and ``all_reduce`` of per-row scalars gives the
log-normaliser, the tail and the gathered support logits. No rank holds ``[rows, V]``; the
backward needs no communication (each rank's gradient is its shard's). Rows come in chunks of a
fixed logits budget (``--log-probs-chunk-size``), so the teacher pass and the loss add a few
``[chunk, V / TP]`` temporaries to what the sampled objective already holds.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from dressage.training.log_probs import chunk_rows
from dressage.training.megatron_path import (
    cp_local,
    cp_world_size,
    local_response_rows,
    tensor_parallel_shard,
)
from dressage.training.reducer import Reducer

__all__ = [
    "DEFAULT_MOPD_TOPK",
    "TeacherSupport",
    "attach_support",
    "mopd_topk",
    "support_of",
    "teacher_support",
    "topk_kl",
    "topk_kl_loss",
]

DEFAULT_MOPD_TOPK = 16
"""K when ``--mopd-topk`` is not given (docs/mopd_objectives.md says why)."""

_SUPPORT_ATTR = "dressage_mopd_topk_support"


@dataclass(frozen=True)
class TeacherSupport:
    """A teacher's distribution at a sample's (rank-local) response positions, O(K) each.

    Attributes:
        ids: ``[R, K]`` int32 token ids, the teacher's top-K at each position.
        log_probs: ``[R, K]`` float32 ``log pT`` at ``ids``, normalised over the whole vocabulary.
        tail: ``[R]`` float32 ``log pT`` of every token outside ``ids`` and the sampled token
            (``-inf`` when that is no token: ``K`` covers the vocabulary).
    """

    ids: Tensor
    log_probs: Tensor
    tail: Tensor

    def __post_init__(self) -> None:
        r = self.tail.shape[0]
        if self.ids.shape != self.log_probs.shape or self.ids.dim() != 2 or self.ids.shape[0] != r:
            raise ValueError(
                f"TeacherSupport: ids {list(self.ids.shape)}, log_probs "
                f"{list(self.log_probs.shape)} and tail {list(self.tail.shape)} must be [R, K], "
                "[R, K] and [R]"
            )

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def to(self, device: torch.device | str) -> TeacherSupport:
        return TeacherSupport(self.ids.to(device), self.log_probs.to(device), self.tail.to(device))


def attach_support(teacher_log_probs: Tensor, support: TeacherSupport) -> Tensor:
    """Hang ``support`` on a sample's ``[R]`` teacher log-probs (returned, the same object)."""
    if support.tail.shape[0] != teacher_log_probs.shape[0]:
        raise ValueError(
            f"a top-k support of {support.tail.shape[0]} positions does not fit teacher log-probs "
            f"of {teacher_log_probs.shape[0]}"
        )
    setattr(teacher_log_probs, _SUPPORT_ATTR, support)
    return teacher_log_probs


def support_of(teacher_log_probs: Any) -> TeacherSupport | None:
    """The support :func:`attach_support` hung on this tensor, or None."""
    support = getattr(teacher_log_probs, _SUPPORT_ATTR, None)
    return support if isinstance(support, TeacherSupport) else None


# --- collectives over the tensor-parallel group (no-ops without one) ---------------------------


def _world(group: Any) -> int:
    return 1 if group is None else int(dist.get_world_size(group=group))


def _all_reduce(x: Tensor, op: Any, group: Any) -> Tensor:
    if _world(group) > 1:
        dist.all_reduce(x, op=op, group=group)
    return x


def _local_index(ids: Tensor, start: int, width: int) -> Tensor:
    """Global ids -> columns of this shard; ids outside it -> ``width`` (a dummy column)."""
    local = ids.long() - start
    return torch.where((local >= 0) & (local < width), local, width)


def _support_mask(ids: Tensor, targets: Tensor, start: int, width: int) -> Tensor:
    """``[n, width]`` bool: this shard's columns that are in ``ids`` (``[n, K]``) or targets."""
    mask = torch.zeros(ids.shape[0], width + 1, dtype=torch.bool, device=ids.device)
    mask.scatter_(-1, _local_index(ids, start, width), True)
    mask.scatter_(-1, _local_index(targets[:, None], start, width), True)
    return mask[:, :width]


def _gather_global(z: Tensor, ids: Tensor, start: int, group: Any) -> Tensor:
    """``z`` (``[n, width]``, a shard) at global ``ids`` (``[n, m]``), summed over the group."""
    width = z.shape[-1]
    index = _local_index(ids, start, width)
    padded = torch.cat([z, z.new_zeros(z.shape[0], 1)], dim=-1)
    return _all_reduce(padded.gather(-1, index), dist.ReduceOp.SUM, group)


def _tail_lse(z: Tensor, mask: Tensor, group: Any) -> Tensor:
    """``logsumexp`` over the columns outside ``mask``, across the group; -inf when none."""
    outside = z.masked_fill(mask, float("-inf"))
    m = _all_reduce(outside.max(-1).values, dist.ReduceOp.MAX, group)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = _all_reduce(torch.exp(outside - safe[:, None]).sum(-1), dist.ReduceOp.SUM, group)
    return torch.where(s > 0, safe + torch.log(s), torch.full_like(s, float("-inf")))


def _lse(z: Tensor, group: Any) -> Tensor:
    m = _all_reduce(z.max(-1).values, dist.ReduceOp.MAX, group)
    s = _all_reduce(torch.exp(z - m[:, None]).sum(-1), dist.ReduceOp.SUM, group)
    return m + torch.log(s)


def _scaled_rows(logits: Tensor, rows: Tensor, temperature: float) -> Tensor:
    z = logits.index_select(0, rows).float()
    return z if temperature == 1.0 else z / temperature


# --- the teacher pass --------------------------------------------------------------------------


def teacher_support(
    logits: Tensor,
    rows: Tensor,
    targets: Tensor,
    k: int,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    group: Any = None,
    vocab_start: int = 0,
) -> tuple[TeacherSupport, Tensor]:
    """The teacher's top-K support at ``logits[rows]`` and its log-probs of ``targets``.

    Args:
        logits: ``[T, V / TP]`` this rank's vocabulary shard (columns ``vocab_start`` on).
        rows: ``[N]`` long rows of ``logits`` (the positions that predict ``targets``).
        targets: ``[N]`` long global token ids (the sampled tokens).
        k: support size, 1 <= k <= V (the global vocabulary).
        group: the tensor-parallel process group (None: one rank holds the whole vocabulary).

    Returns:
        ``(support, target_log_probs)``: the support of the N positions and ``[N]`` float32
        ``log pT(targets)``; identical on every rank of ``group``. No gradient.
    """
    width = int(logits.shape[-1])
    vocab = width * _world(group)
    if not 1 <= k <= vocab:
        raise ValueError(f"--mopd-topk {k} must be between 1 and the vocabulary size {vocab}")
    n = int(rows.numel())
    device = logits.device
    ids = torch.empty(n, k, dtype=torch.int32, device=device)
    log_probs = torch.empty(n, k, dtype=torch.float32, device=device)
    tail = torch.empty(n, dtype=torch.float32, device=device)
    target_lp = torch.empty(n, dtype=torch.float32, device=device)
    chunk = chunk_rows(width, chunk_tokens, device)
    with torch.no_grad():
        for s in range(0, n, chunk):
            z = _scaled_rows(logits, rows[s : s + chunk], temperature)
            y = targets[s : s + chunk].to(device).long()
            top_z, top_ids = _global_topk(z, k, vocab_start, group)
            lse = _lse(z, group)
            mask = _support_mask(top_ids, y, vocab_start, width)
            ids[s : s + chunk] = top_ids.int()
            log_probs[s : s + chunk] = top_z - lse[:, None]
            tail[s : s + chunk] = _tail_lse(z, mask, group) - lse
            target_lp[s : s + chunk] = (
                _gather_global(z, y[:, None], vocab_start, group).squeeze(-1) - lse
            )
    return TeacherSupport(ids, log_probs, tail), target_lp


def _global_topk(z: Tensor, k: int, start: int, group: Any) -> tuple[Tensor, Tensor]:
    """The top-``k`` (values, global ids) of each row over the whole vocabulary."""
    local_z, local_ids = z.topk(min(k, z.shape[-1]), dim=-1)
    world = _world(group)
    if world == 1:
        return local_z, local_ids + start
    # one all_gather of (value, id) pairs: float64 holds both exactly (ids < 2**53)
    pairs = torch.stack([local_z.double(), (local_ids + start).double()], dim=-1)
    gathered = [torch.empty_like(pairs) for _ in range(world)]
    dist.all_gather(gathered, pairs.contiguous(), group=group)
    every = torch.cat(gathered, dim=1)  # [n, world * k', 2]
    best = every[..., 0].topk(k, dim=-1).indices
    return (
        every[..., 0].gather(-1, best).float(),
        every[..., 1].gather(-1, best).long(),
    )


# --- the loss ----------------------------------------------------------------------------------


class _BucketKL(torch.autograd.Function):
    """``(1 - b) KL(pS || pT) + b KL(pT || pS)`` per row over the buckets (support tokens, the
    sampled token when outside the top-K, the tail); the softmax is recomputed in backward."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        rows: Tensor,
        targets: Tensor,
        support: TeacherSupport,
        teacher_target: Tensor,
        temperature: float,
        chunk: int,
        forward_weight: float,
        group: Any,
        vocab_start: int,
    ) -> Tensor:
        n, k = int(rows.numel()), support.k
        width = int(logits.shape[-1])
        device = logits.device
        b = forward_weight
        out = torch.empty(n, dtype=torch.float32, device=device)
        lse_all = torch.empty(n, dtype=torch.float32, device=device)
        # per bucket: coefficient a_B and log pT(B) - log pS(B) (see backward)
        coef = torch.zeros(n, k + 2, dtype=torch.float32, device=device)
        gap = torch.zeros(n, k + 2, dtype=torch.float32, device=device)
        for s in range(0, n, chunk):
            sl = slice(s, s + chunk)
            z = _scaled_rows(logits, rows[sl], temperature)
            y = targets[sl].long()
            ids = support.ids[sl].long()
            lse = _lse(z, group)
            picked = _gather_global(z, torch.cat([ids, y[:, None]], -1), vocab_start, group)
            s_lp = picked - lse[:, None]  # [c, k + 1]: support tokens, then the sampled one
            s_tail = _tail_lse(z, _support_mask(ids, y, vocab_start, width), group) - lse
            t_lp = torch.cat(
                [support.log_probs[sl].float(), teacher_target[sl].float()[:, None]], -1
            )
            # buckets: K support tokens, the sampled token (unless among them), the tail
            present = torch.ones(z.shape[0], k + 2, dtype=torch.bool, device=device)
            present[:, k] = ~(ids == y[:, None]).any(-1)
            present[:, k + 1] = torch.isfinite(s_tail)
            log_s = torch.cat([s_lp, s_tail[:, None]], -1)
            log_t = torch.cat([t_lp, support.tail[sl].float()[:, None]], -1)
            log_s = torch.where(present, log_s, torch.zeros_like(log_s))
            log_t = torch.where(present, log_t, torch.zeros_like(log_t))
            p_s, p_t = log_s.exp() * present, log_t.exp() * present
            reverse = (p_s * (log_s - log_t)).sum(-1)
            value = (1.0 - b) * reverse
            if b:
                value = value + b * (p_t * (log_t - log_s)).sum(-1)
            out[sl] = value
            lse_all[sl] = lse
            coef[sl] = torch.where(
                present, (1.0 - b) * (log_s - log_t - reverse[:, None]) + b, torch.zeros_like(log_s)
            )
            gap[sl] = torch.where(present, log_t - log_s, torch.full_like(log_s, float("-inf")))
        ctx.save_for_backward(logits, rows, targets, support.ids, lse_all, coef, gap)
        ctx.settings = (temperature, chunk, b, group, vocab_start)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        logits, rows, targets, support_ids, lse_all, coef, gap = ctx.saved_tensors
        t, chunk, b, group, start = ctx.settings
        width = int(logits.shape[-1])
        k = int(support_ids.shape[1])
        grad = torch.zeros_like(logits)
        for s in range(0, int(rows.numel()), chunk):
            sl = slice(s, s + chunk)
            r = rows[sl]
            z = _scaled_rows(logits, r, t)
            log_p = z - lse_all[sl, None]
            # dL/dz_j = pS_j a_B(j) - b pT(B) pS_j / pS(B)  (B(j): j's bucket), where
            # a_B = (1 - b)(log pS(B) - log pT(B) - KL) + b; the second term in log space.
            # Every column starts as a tail column, then the support's are overwritten.
            part = log_p.exp() * coef[sl, k + 1, None]
            if b:
                part = part - b * torch.exp(log_p + gap[sl, k + 1, None])
            ids = torch.cat([support_ids[sl].long(), targets[sl].long()[:, None]], -1)
            index = _local_index(ids, start, width)
            # the sampled token is its own bucket only when outside the top-K
            index[:, k] = torch.where(torch.isfinite(gap[sl, k]), index[:, k], width)
            lp_ids = torch.cat([log_p, log_p.new_zeros(log_p.shape[0], 1)], -1).gather(-1, index)
            single = lp_ids.exp() * coef[sl, : k + 1]
            if b:
                single = single - b * torch.exp(lp_ids + gap[sl, : k + 1])
            part = torch.cat([part, part.new_zeros(part.shape[0], 1)], -1)
            part.scatter_(-1, index, single)
            part = part[:, :width] * (grad_out[sl, None].float() / t)
            grad.index_copy_(0, r, part.to(grad.dtype))
        return grad, None, None, None, None, None, None, None, None, None


def topk_kl(
    logits: Tensor,
    rows: Tensor,
    targets: Tensor,
    support: TeacherSupport,
    teacher_target_log_probs: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    forward_weight: float = 0.0,
    group: Any = None,
    vocab_start: int = 0,
) -> Tensor:
    """Per row the bucketed ``(1 - b)`` reverse plus ``b`` forward KL (module docstring).

    Args:
        logits: ``[T, V / TP]`` the student's vocabulary shard; may require grad.
        rows: ``[N]`` long, distinct rows of ``logits`` (response positions).
        targets: ``[N]`` long global ids of the sampled tokens.
        support: the teacher's support at those N positions.
        teacher_target_log_probs: ``[N]`` ``log pT(targets)``.
        forward_weight: ``b`` in [0, 1].
        group: the tensor-parallel group (None: the whole vocabulary is here).

    Returns:
        ``[N]`` float32 (nats), differentiable in ``logits``; equal on every rank of ``group``.
    """
    if not 0.0 <= forward_weight <= 1.0:
        raise ValueError(f"forward_weight must be in [0, 1], got {forward_weight}")
    n = int(rows.numel())
    if support.tail.shape[0] != n or teacher_target_log_probs.shape[0] != n:
        raise ValueError(
            f"the teacher's top-k support covers {support.tail.shape[0]} positions and its "
            f"sampled-token log-probs {teacher_target_log_probs.shape[0]}; the student's "
            f"response has {n}"
        )
    device = logits.device
    chunk = chunk_rows(int(logits.shape[-1]), chunk_tokens, device)
    out: Tensor = _BucketKL.apply(
        logits,
        rows,
        targets.to(device),
        support.to(device),
        teacher_target_log_probs.detach().to(device),
        float(temperature),
        chunk,
        float(forward_weight),
        group,
        int(vocab_start),
    )
    return out


# --- the loss hook's part ----------------------------------------------------------------------


def mopd_topk(args: Namespace) -> int:
    """``args.mopd_topk`` (None or absent: :data:`DEFAULT_MOPD_TOPK`), checked to be >= 1."""
    value = getattr(args, "mopd_topk", None)
    k = DEFAULT_MOPD_TOPK if value is None else int(value)
    if k < 1:
        raise ValueError(f"--mopd-topk must be at least 1, got {k}")
    return k


def _cat_supports(teacher: Sequence[Tensor], rows: Sequence[Tensor]) -> TeacherSupport:
    supports = []
    for i, (t, r) in enumerate(zip(teacher, rows, strict=True)):
        support = support_of(t)
        if support is None:
            raise KeyError(
                f"mopd_policy_loss: --mopd-objective topk needs each sample's teacher top-k "
                f"support on its teacher_log_probs (sample {i} of the micro-batch has none): the "
                "MOPD trainer's teacher pass keeps it when the objective is topk"
            )
        if support.tail.shape[0] != r.numel():
            raise ValueError(
                f"sample {i} of the micro-batch: the teacher's top-k support has "
                f"{support.tail.shape[0]} positions, its rank-local response {r.numel()}"
            )
        supports.append(support)
    return TeacherSupport(
        torch.cat([s.ids for s in supports]),
        torch.cat([s.log_probs for s in supports]),
        torch.cat([s.tail for s in supports]),
    )


def topk_kl_loss(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, sum_of_sample_mean: Reducer
) -> Tensor:
    """``sum_of_sample_mean`` of the per-token bucketed KL (the module docstring).

    Args:
        args: reads ``rollout_temperature``, ``log_probs_chunk_size``,
            ``mopd_forward_kl_weight`` and ``allgather_cp``.
        batch: ``unconcat_tokens``, ``total_lengths``, ``response_lengths`` and
            ``teacher_log_probs`` (``[R_i]`` per sample, CP-local under Megatron, each carrying
            its :class:`TeacherSupport`).
        logits: packed ``[1, T, V / TP]``, this rank's CP slice of each sequence under Megatron.
    """
    if getattr(args, "allgather_cp", False) and cp_world_size() > 1:
        raise ValueError(
            "--mopd-objective topk does not support --allgather-cp (it follows slime's zigzag "
            "context-parallel layout); drop --allgather-cp"
        )
    flat = logits.reshape(-1, logits.shape[-1])
    total, resp = list(batch["total_lengths"]), list(batch["response_lengths"])
    rows = local_response_rows(total, resp)
    responses = [
        torch.as_tensor(t).reshape(-1)[int(n) - int(r) :]
        for t, n, r in zip(batch["unconcat_tokens"], total, resp, strict=True)
    ]
    targets = cp_local(responses, total, resp)
    teacher = batch.get("teacher_log_probs")
    if teacher is None:
        raise KeyError("mopd_policy_loss: the loss batch has no 'teacher_log_probs'")
    support = _cat_supports(list(teacher), rows)
    group, start = tensor_parallel_shard(int(flat.shape[-1]))
    device = flat.device
    kl = topk_kl(
        flat,
        torch.cat(rows).to(device),
        torch.cat([t.reshape(-1) for t in targets]).to(device),
        support,
        torch.cat([torch.as_tensor(t).reshape(-1) for t in teacher]),
        temperature=float(getattr(args, "rollout_temperature", 1.0) or 1.0),
        chunk_tokens=int(getattr(args, "log_probs_chunk_size", 0) or 0),
        forward_weight=float(getattr(args, "mopd_forward_kl_weight", 0.0) or 0.0),
        group=group,
        vocab_start=start,
    )
    return sum_of_sample_mean(kl)
