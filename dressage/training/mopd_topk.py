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
logsumexp z``, summed directly over the tail (the support's terms set to 0, never subtracted
from a total) and again with the tail's own maximum where it is below 1e-30 of the row's
largest term, so it stays exact and finite however small it is. ``b``
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
fixed list of batch keys, and ``teacher_log_probs`` is the one that reaches it. The embedded
trainer's teachers (a Hugging Face causal LM, one rank, scored by
:class:`dressage.training.teacher_rotation.TeacherBank`) get it from
:func:`causal_lm_response_topk`.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from dressage.config.job import DEFAULT_MOPD_TOPK
from dressage.slime.mopd_args import mopd_args
from dressage.slime.train_args import log_prob_args
from dressage.training.log_probs import causal_lm_response_hidden, chunk_rows
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
    "TopkKL",
    "attach_support",
    "causal_lm_response_topk",
    "mopd_topk",
    "support_of",
    "teacher_support",
    "topk_kl",
    "topk_kl_loss",
    "topk_kl_parts",
]

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


def _support_index(ids: Tensor, start: int, width: int) -> tuple[Tensor, Tensor]:
    """Global ids ``[n, m]`` -> (this shard's columns, clamped into it; whether each is here)."""
    local = ids.long() - start
    inside = (local >= 0) & (local < width)
    return local.clamp(0, width - 1), inside


def _gather_support(z: Tensor, index: Tensor, inside: Tensor, group: Any) -> Tensor:
    """``z`` (``[n, width]``, a shard) at the support (:func:`_support_index`), summed over the
    group: every id lives on one shard."""
    picked = z.gather(-1, index)
    return _all_reduce(
        torch.where(inside, picked, torch.zeros_like(picked)), dist.ReduceOp.SUM, group
    )


def _tail_sum_in_place(z: Tensor, m: Tensor, index: Tensor, counted: Tensor, group: Any) -> Tensor:
    """``sum_{v outside the support} exp(z_v - m)`` over the whole vocabulary, per row.

    ``z`` is overwritten with ``exp(z - m)`` and then the support's columns (``counted``: here,
    and each id once) with exactly 0, so the tail is summed directly rather than as a difference
    of totals (no cancellation, however small it is).
    """
    e = z.sub_(m[:, None]).exp_()
    picked = e.gather(-1, index)
    e.scatter_add_(-1, index, torch.where(counted, -picked, torch.zeros_like(picked)))
    return _all_reduce(e.sum(-1), dist.ReduceOp.SUM, group)


_TINY_TAIL = 1e-30
"""Below this share of the row's largest term, the tail is summed again with its own maximum
(terms would underflow against the row's maximum)."""


def _support_mask(ids: Tensor, start: int, width: int) -> Tensor:
    """``[n, width]`` bool: this shard's columns among ``ids`` (``[n, m]`` global)."""
    index, inside = _support_index(ids, start, width)
    mask = torch.zeros(ids.shape[0], width, dtype=torch.float32, device=ids.device)
    mask.scatter_add_(-1, index, inside.float())
    return mask > 0


def _tail_lse_exact(z: Tensor, ids: Tensor, start: int, group: Any) -> Tensor:
    """``logsumexp`` of ``z`` (``[n, width]``) outside ``ids``, with the tail's own maximum
    across the group (-inf where the tail is empty)."""
    outside = z.masked_fill(_support_mask(ids, start, int(z.shape[-1])), float("-inf"))
    m = _all_reduce(outside.max(-1).values, dist.ReduceOp.MAX, group)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    total = _all_reduce(torch.exp(outside - safe[:, None]).sum(-1), dist.ReduceOp.SUM, group)
    return torch.where(total > 0, safe + torch.log(total), torch.full_like(total, float("-inf")))


def _normalise(
    z: Tensor,
    m: Tensor,
    picked: Tensor,
    ids: Tensor,
    distinct: Tensor,
    vocab: int,
    refetch: Callable[[Tensor], Tensor],
    start: int,
    group: Any,
) -> tuple[Tensor, Tensor]:
    """The row's log-normaliser and its tail's log-sum, from one pass over ``z`` (consumed).

    Args:
        z: ``[n, width]`` scaled logits, a scratch copy (overwritten).
        m: ``[n]`` the row maximum over the whole vocabulary.
        picked: ``[n, m]`` the logits at the support ``ids`` (global values).
        distinct: ``[n, m]`` bool: the id is counted (each support id once).
        refetch: the scaled logits of a subset of rows again (tiny tails are summed again).

    Returns:
        ``(lse, tail_lse)`` ``[n]``; ``tail_lse`` is -inf where the support covers the vocabulary.
    """
    width = int(z.shape[-1])
    index, inside = _support_index(ids, start, width)
    tail = _tail_sum_in_place(z, m, index, inside & distinct, group)
    support = torch.where(distinct, torch.exp(picked - m[:, None]), torch.zeros_like(picked))
    lse = m + torch.log(tail + support.sum(-1))
    nonempty = distinct.sum(-1) < vocab
    tail_lse = torch.where(
        nonempty & (tail > 0), m + torch.log(tail), torch.full_like(tail, float("-inf"))
    )
    again = (nonempty & (tail < _TINY_TAIL)).nonzero().squeeze(-1)
    if again.numel():  # the same rows on every rank: the test reads reduced values
        tail_lse[again] = _tail_lse_exact(refetch(again), ids[again], start, group)
    return lse, tail_lse


def _scaled_rows(logits: Tensor, rows: Tensor, temperature: float) -> Tensor:
    """A float32 copy of ``logits[rows] / temperature`` (a scratch buffer the caller owns)."""
    z = logits.index_select(0, rows)
    z = z.float() if z.dtype != torch.float32 else z
    return z if temperature == 1.0 else z.div_(temperature)


def _rows_again(logits: Tensor, rows: Tensor, temperature: float) -> Callable[[Tensor], Tensor]:
    """``sub -> _scaled_rows(logits, rows[sub], temperature)``: some rows fetched again."""

    def fetch(sub: Tensor) -> Tensor:
        return _scaled_rows(logits, rows[sub], temperature)

    return fetch


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
            r = rows[s : s + chunk]
            raw = logits.index_select(0, r)
            # the top-K of the logits as the head wrote them (bf16 under autocast: half the
            # bytes to select from); float32 holds them exactly and dividing by T keeps the
            # order, so the support is z's and its values are z's same elements
            top_raw, top_ids = _global_topk(raw, k, vocab_start, group)
            top_z = top_raw.float() if temperature == 1.0 else top_raw.float().div_(temperature)
            z = raw.float() if raw.dtype != torch.float32 else raw  # raw is a copy: scaled in place
            z = z if temperature == 1.0 else z.div_(temperature)
            y = targets[s : s + chunk].to(device).long()
            index, inside = _support_index(y[:, None], vocab_start, width)
            z_y = _gather_support(z, index, inside, group).squeeze(-1)
            support = torch.cat([top_ids, y[:, None]], -1)
            distinct = torch.ones_like(support, dtype=torch.bool)
            distinct[:, k] = ~(top_ids == y[:, None]).any(-1)
            lse, tail_lse = _normalise(
                z,
                top_z[:, 0],  # the global maximum
                torch.cat([top_z, z_y[:, None]], -1),
                support,
                distinct,
                vocab,
                _rows_again(logits, r, temperature),
                vocab_start,
                group,
            )
            ids[s : s + chunk] = top_ids.int()
            log_probs[s : s + chunk] = top_z - lse[:, None]
            tail[s : s + chunk] = tail_lse - lse
            target_lp[s : s + chunk] = z_y - lse
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


def causal_lm_response_topk(
    model: nn.Module,
    tokens: Sequence[Tensor],
    response_lengths: Sequence[int],
    k: int,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    input_embeddings: Callable[[Tensor], Tensor] | None = None,
) -> list[Tensor]:
    """A Hugging Face causal LM's teacher pass: per sample its log-probs of the sampled tokens,
    each carrying (:func:`attach_support`) the model's top-``k`` support at those positions.

    The output embeddings run over chunks of response positions (``[chunk, V]`` at a time, never
    ``[sum R_i, V]``); one rank holds the whole vocabulary. Call under ``torch.no_grad()``.

    Returns:
        Per sample ``[R_i]`` float32 ``log p(y_t)``, its :class:`TeacherSupport` ``[R_i, k]``
        on the same device.
    """
    h, targets, head = causal_lm_response_hidden(
        model, tokens, response_lengths, input_embeddings=input_embeddings
    )
    chunk = chunk_rows(int(cast(Tensor, head.weight).shape[0]), chunk_tokens, h.device)
    parts = []
    for s in range(0, int(h.shape[0]), chunk):
        logits = head(h[s : s + chunk])
        rows = torch.arange(logits.shape[0], device=logits.device)
        parts.append(
            teacher_support(
                logits, rows, targets[s : s + chunk], k, temperature=temperature, chunk_tokens=chunk
            )
        )
    split = [int(r) for r in response_lengths]
    ids = _cat_split([p.ids for p, _ in parts], split, (0, k), torch.int32, h.device)
    log_probs = _cat_split([p.log_probs for p, _ in parts], split, (0, k), torch.float32, h.device)
    tail = _cat_split([p.tail for p, _ in parts], split, (0,), torch.float32, h.device)
    target_lp = _cat_split([lp for _, lp in parts], split, (0,), torch.float32, h.device)
    return [
        attach_support(lp, TeacherSupport(i, q, t))
        for lp, i, q, t in zip(target_lp, ids, log_probs, tail, strict=True)
    ]


def _cat_split(
    parts: list[Tensor],
    split: list[int],
    empty: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> list[Tensor]:
    """``parts`` concatenated (an empty ``empty``-shaped tensor when none), split per sample."""
    whole = torch.cat(parts) if parts else torch.empty(empty, dtype=dtype, device=device)
    return list(whole.split(split))


# --- the loss ----------------------------------------------------------------------------------


class _BucketKL(torch.autograd.Function):
    """``(1 - b) KL(pS || pT) + b KL(pT || pS)`` per row over the buckets (support tokens, the
    sampled token when outside the top-K, the tail); the softmax is recomputed in backward.

    The gradient in a logit ``z_j`` (at temperature 1), with ``B(j)`` the bucket of ``j`` and
    ``a_B = (1 - b) (log pS(B) - log pT(B) - KL_rev) + b``, is
    ``pS_j a_B - b pT(B) pS_j / pS(B)``: for a support token ``pS_j a_j - b pT_j``, for a tail
    token ``exp(z_j - lse_tail) (a_tail pS(tail) - b pT(tail))``, with ``lse_tail`` the
    student's log-sum over the tail. Neither factor can overflow, however small ``pS(tail)`` is.
    """

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
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, k = int(rows.numel()), support.k
        width = int(logits.shape[-1])
        vocab = width * _world(group)
        device = logits.device
        b = forward_weight
        out = torch.empty(n, dtype=torch.float32, device=device)
        sampled = torch.empty(n, dtype=torch.float32, device=device)  # log pS(y_t)
        student_tail = torch.empty(n, dtype=torch.float32, device=device)  # log pS(tail)
        # for backward, per row: the tail's log-sum and factor, the singles' gradients
        tail_lse_all = torch.empty(n, dtype=torch.float32, device=device)
        tail_factor = torch.empty(n, dtype=torch.float32, device=device)
        singles = torch.empty(n, k + 1, dtype=torch.float32, device=device)
        distinct_all = torch.empty(n, k + 1, dtype=torch.bool, device=device)
        with torch.no_grad():
            for s in range(0, n, chunk):
                sl = slice(s, s + chunk)
                r = rows[sl]
                z = _scaled_rows(logits, r, temperature)
                y = targets[sl].long()
                top_ids = support.ids[sl].long()
                ids = torch.cat([top_ids, y[:, None]], -1)
                distinct = torch.ones_like(ids, dtype=torch.bool)
                distinct[:, k] = ~(top_ids == y[:, None]).any(-1)
                index, inside = _support_index(ids, vocab_start, width)
                picked = _gather_support(z, index, inside, group)
                m = _all_reduce(z.max(-1).values, dist.ReduceOp.MAX, group)
                lse, tail_lse = _normalise(
                    z,
                    m,
                    picked,
                    ids,
                    distinct,
                    vocab,
                    _rows_again(logits, r, temperature),
                    vocab_start,
                    group,
                )
                # buckets: K support tokens, the sampled token (unless among them), the tail
                s_tail = tail_lse - lse
                sampled[sl] = picked[:, k] - lse
                present = torch.cat([distinct, torch.isfinite(s_tail)[:, None]], -1)
                log_s = torch.cat([picked - lse[:, None], s_tail[:, None]], -1)
                log_t = torch.cat(
                    [
                        support.log_probs[sl].float(),
                        teacher_target[sl].float()[:, None],
                        support.tail[sl].float()[:, None],
                    ],
                    -1,
                )
                log_s = torch.where(present, log_s, torch.zeros_like(log_s))
                log_t = torch.where(present, log_t, torch.zeros_like(log_t))
                p_s, p_t = log_s.exp() * present, log_t.exp() * present
                r_b = log_s - log_t  # 0 off the present buckets
                reverse = (p_s * r_b).sum(-1)
                value = (1.0 - b) * reverse
                if b:
                    value = value - b * (p_t * r_b).sum(-1)
                out[sl] = value
                student_tail[sl] = s_tail
                # per bucket a_B pS(B) - b pT(B) = (1 - b) pS(B) (r_B - KL) + b (pS(B) - pT(B)),
                # both differences taken without cancellation: r_B - KL relative to the heaviest
                # bucket (sum_B' pS(B') (r_B - r_B') = d_B - sum_B' pS(B') d_B'), and
                # pS - pT through expm1 on whichever side cannot overflow
                d = r_b - r_b.gather(-1, p_s.argmax(-1, keepdim=True))
                centred = d - (p_s * d).sum(-1, keepdim=True)
                grads = (1.0 - b) * p_s * centred
                if b:
                    gap = torch.where(
                        r_b >= 0,
                        p_s * -torch.expm1(-r_b.clamp(min=0.0)),
                        p_t * torch.expm1(r_b.clamp(max=0.0)),
                    )
                    grads = grads + b * gap
                singles[sl] = grads[:, : k + 1]
                tail_factor[sl] = grads[:, k + 1]  # 0 where the tail is empty
                # the tail's log-sum (any finite value where it is empty: its factor is 0)
                tail_lse_all[sl] = torch.where(present[:, k + 1], tail_lse, lse)
                distinct_all[sl] = distinct
        ctx.save_for_backward(logits, rows, targets, support.ids, tail_lse_all, tail_factor)
        ctx.singles = (singles, distinct_all)
        ctx.settings = (temperature, chunk, group, vocab_start)
        ctx.mark_non_differentiable(sampled, student_tail)
        return out, sampled, student_tail

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
        logits, rows, targets, support_ids, tail_lse, tail_factor = ctx.saved_tensors
        singles, distinct = ctx.singles
        t, chunk, group, start = ctx.settings
        width = int(logits.shape[-1])
        grad = torch.zeros_like(logits)
        for s in range(0, int(rows.numel()), chunk):
            sl = slice(s, s + chunk)
            r = rows[sl]
            g = grad_out[sl].float() / t
            # every column as a tail column: exp(z_j - lse_tail) <= 1 there; the support's
            # columns (clamped, so nothing overflows) are overwritten below
            z = _scaled_rows(logits, r, t)
            part = (
                z.sub_(tail_lse[sl, None])
                .clamp_(max=0.0)
                .exp_()
                .mul_((tail_factor[sl] * g)[:, None])
            )
            ids = torch.cat([support_ids[sl].long(), targets[sl].long()[:, None]], -1)
            index, inside = _support_index(ids, start, width)
            counted = inside & distinct[sl]
            # set, not added: zero each support column exactly, then add its own gradient
            have = part.gather(-1, index)
            part.scatter_add_(-1, index, torch.where(counted, -have, torch.zeros_like(have)))
            want = singles[sl] * g[:, None]
            part.scatter_add_(-1, index, torch.where(counted, want, torch.zeros_like(want)))
            grad.index_copy_(0, r, part.to(grad.dtype))
        return grad, None, None, None, None, None, None, None, None, None


class TopkKL(NamedTuple):
    """What :func:`topk_kl_parts` computes a row: the loss and, free with it, two readings."""

    kl: Tensor
    """``[N]`` the bucketed KL, differentiable in the logits."""
    student_log_probs: Tensor
    """``[N]`` ``log pS(y_t)``, the student's sampled-token log-probs (no gradient)."""
    student_tail: Tensor
    """``[N]`` ``log pS(tail)``, the student's mass outside the support (no gradient)."""


def topk_kl_parts(
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
) -> TopkKL:
    """Per row the bucketed ``(1 - b)`` reverse plus ``b`` forward KL (module docstring), with
    the student's sampled-token log-probs and tail mass from the same pass.

    Args:
        logits: ``[T, V / TP]`` the student's vocabulary shard; may require grad.
        rows: ``[N]`` long, distinct rows of ``logits`` (response positions).
        targets: ``[N]`` long global ids of the sampled tokens.
        support: the teacher's support at those N positions.
        teacher_target_log_probs: ``[N]`` ``log pT(targets)``.
        forward_weight: ``b`` in [0, 1].
        group: the tensor-parallel group (None: the whole vocabulary is here).

    Returns:
        ``[N]`` float32 values each, equal on every rank of ``group``.
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
    kl, sampled, tail = _BucketKL.apply(
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
    return TopkKL(kl, sampled, tail)


def topk_kl(
    logits: Tensor,
    rows: Tensor,
    targets: Tensor,
    support: TeacherSupport,
    teacher_target_log_probs: Tensor,
    **options: Any,
) -> Tensor:
    """``[N]`` the bucketed KL alone (:func:`topk_kl_parts`, same arguments)."""
    return topk_kl_parts(logits, rows, targets, support, teacher_target_log_probs, **options).kl


# --- the loss hook's part ----------------------------------------------------------------------


def mopd_topk(args: Namespace) -> int:
    """``args.mopd_topk`` (None or absent: :data:`DEFAULT_MOPD_TOPK`), checked to be >= 1."""
    value = mopd_args(args).mopd_topk
    k = DEFAULT_MOPD_TOPK if value is None else value
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
) -> tuple[Tensor, TopkKL, TeacherSupport]:
    """``sum_of_sample_mean`` of the per-token bucketed KL (the module docstring).

    Args:
        args: reads ``rollout_temperature``, ``log_probs_chunk_size``,
            ``mopd_forward_kl_weight`` and ``allgather_cp``.
        batch: ``unconcat_tokens``, ``total_lengths``, ``response_lengths`` and
            ``teacher_log_probs`` (``[R_i]`` per sample, CP-local under Megatron, each carrying
            its :class:`TeacherSupport`).
        logits: packed ``[1, T, V / TP]``, this rank's CP slice of each sequence under Megatron.

    Returns:
        ``(loss, per-token parts, the teacher's support)``: the parts (:class:`TopkKL`) and the
        support row for row in the order of slime's response log-probs (CP-local), for metrics.
    """
    view, scoring = mopd_args(args), log_prob_args(args)
    if view.allgather_cp and cp_world_size() > 1:
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
    parts = topk_kl_parts(
        flat,
        torch.cat(rows).to(device),
        torch.cat([t.reshape(-1) for t in targets]).to(device),
        support,
        torch.cat([torch.as_tensor(t).reshape(-1) for t in teacher]),
        temperature=scoring.rollout_temperature,
        chunk_tokens=scoring.chunk_tokens,
        forward_weight=view.mopd_forward_kl_weight,
        group=group,
        vocab_start=start,
    )
    return sum_of_sample_mean(parts.kl), parts, support
