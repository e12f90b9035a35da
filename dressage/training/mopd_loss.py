"""Multi-teacher on-policy distillation (MOPD): the advantage hook and the loss hook.

Each sample is scored by the teacher its dataset names (``teacher_id``, carried in slime's
``prompt`` slot). Per response token::

    A_t = clip(log pi_teacher(y_t) - log pi_student_old(y_t), -c, c)      (no gradient)
    L   = sum_of_sample_mean(-A_t * log pi_student(y_t))                 (token-mean per rollout)

``c`` is ``--mopd-advantage-clip`` (default 5). There is no GRPO return, PPO ratio, value
target, entropy bonus or KL term; the environment reward is logged per teacher and never read by
the advantage or the loss. Wire it into slime (or the embedded trainer, same flags)::

    --advantage-estimator grpo  # ignored: the custom advantage replaces the estimator
    --custom-advantage-function-path dressage.training.mopd_loss.compute_mopd_advantages
    --loss-type custom_loss
    --custom-loss-function-path dressage.training.mopd_loss.mopd_policy_loss

slime applies OPD KL shaping (``--use-opd`` with a non-zero ``--opd-kl-coef``) and
``--normalize-advantages`` *after* a custom advantage hook; both would change A_t, so the hook
refuses to run with them.

``--mopd-objective dense`` (embedded trainer only, :mod:`dressage.training.mopd_dense`) swaps
the loss for the exact reverse KL to the teacher over the whole vocabulary at every response
position; ``--mopd-objective topk`` (both backends, :mod:`dressage.training.mopd_topk`) for the
KL over the teacher's top-K tokens, the sampled one and a tail bucket. The advantage hook still
runs, but its A_t then only feeds the metrics.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dressage.slime.mopd_args import mopd_args
from dressage.slime.train_args import advantage_args
from dressage.training.log_probs import log_prob_function
from dressage.training.losses import approx_kl
from dressage.training.megatron_path import cp_local, cp_rank, cp_world_size
from dressage.training.mopd_dense import dense_reverse_kl_loss, mopd_objective
from dressage.training.mopd_metrics import deferred_store, mopd_teacher_metrics
from dressage.training.mopd_topk import topk_kl_loss
from dressage.training.reducer import Reducer

__all__ = [
    "DEFAULT_ADVANTAGE_CLIP",
    "compute_mopd_advantages",
    "mopd_advantages",
    "mopd_policy_loss",
]

DEFAULT_ADVANTAGE_CLIP = 5.0


def _clip(args: Namespace) -> float:
    value = mopd_args(args).mopd_advantage_clip
    clip = DEFAULT_ADVANTAGE_CLIP if value is None else value
    if not clip > 0:
        raise ValueError(f"--mopd-advantage-clip must be > 0, got {clip}")
    return clip


def mopd_advantages(teacher_log_probs: Tensor, student_log_probs: Tensor, clip: float) -> Tensor:
    """``clip(teacher - student, -clip, clip)``, detached, float32, same shape as the inputs."""
    if teacher_log_probs.shape != student_log_probs.shape:
        raise ValueError(
            f"teacher log-probs {tuple(teacher_log_probs.shape)} and student log-probs "
            f"{tuple(student_log_probs.shape)} disagree"
        )
    diff = teacher_log_probs.detach().float() - student_log_probs.detach().float().to(
        teacher_log_probs.device
    )
    return diff.clamp(-clip, clip)


def _student_key(args: Namespace) -> str:
    return advantage_args(args).student_key


def _per_sample(rollout_data: Mapping[str, Any], key: str, n: int | None = None) -> list[Tensor]:
    values = rollout_data.get(key)
    if values is None:
        raise KeyError(f"MOPD needs rollout_data[{key!r}] (per-sample response-token tensors)")
    out = [torch.as_tensor(v) for v in values]
    if n is not None and len(out) != n:
        raise ValueError(f"rollout_data[{key!r}] has {len(out)} samples, expected {n}")
    return out


def _local_raw_rewards(rollout_data: Mapping[str, Any], n: int) -> list[float | None] | None:
    # slime ships raw_reward whole (all ranks) and the rank's positions under `partition`.
    raw = rollout_data.get("local_raw_reward", rollout_data.get("raw_reward"))
    if raw is None:
        return None
    raw = list(raw)
    if len(raw) != n:
        partition = rollout_data.get("partition")
        if partition is None or len(partition) != n:
            return None
        raw = [raw[int(i)] for i in partition]
    return [None if r is None else float(r) for r in raw]


def _check_args(args: Namespace) -> None:
    view = advantage_args(args)
    if view.use_opd and view.opd_kl_coef != 0.0:
        raise ValueError(
            "MOPD sets the advantage itself; slime's --use-opd KL shaping would be applied on "
            "top of it. Drop --use-opd or set --opd-kl-coef 0."
        )
    if view.normalize_advantages:
        raise ValueError(
            "MOPD advantages are log-prob gaps; --normalize-advantages would rescale them"
        )


def compute_mopd_advantages(args: Namespace, rollout_data: MutableMapping[str, Any]) -> None:
    """slime's ``--custom-advantage-function-path`` hook: set ``advantages`` and ``returns``.

    Reads (DP-local, lists of ``[R_i]`` tensors): ``teacher_log_probs``, ``log_probs`` (or
    ``rollout_log_probs`` with ``--use-rollout-logprobs``), ``loss_masks``; for metrics also
    ``prompt`` (teacher ids), ``rollout_ids``, ``rollout_mask_sums``, ``raw_reward``.
    Writes ``advantages`` and ``returns`` (equal, detached float32) and the per-teacher metrics
    as 0-d tensors under ``mopd/...`` keys (see ``dressage.training.mopd_metrics``).
    """
    _check_args(args)
    clip = _clip(args)
    student = _per_sample(rollout_data, _student_key(args))
    teacher = _per_sample(rollout_data, "teacher_log_probs", len(student))
    advantages = []
    for i, (t, s) in enumerate(zip(teacher, student, strict=True)):
        try:
            advantages.append(mopd_advantages(t, s, clip))
        except ValueError as exc:
            raise ValueError(f"sample {i}: {exc}") from exc
    rollout_data["advantages"] = advantages
    rollout_data["returns"] = [a.clone() for a in advantages]

    teacher_ids = rollout_data.get("prompt")
    if teacher_ids is None or rollout_data.get("loss_masks") is None:
        return
    n = len(student)
    whole = _per_sample(rollout_data, "loss_masks", n)
    trainable = [float(m.sum()) for m in whole]
    denoms = rollout_data.get("rollout_mask_sums")
    if denoms is None:
        denoms = trainable
    masks, raw_rewards = whole, _local_raw_rewards(rollout_data, n)
    if cp_world_size() > 1:
        # log-probs are this rank's CP slice and slime keeps masks whole: cut the masks to match
        # (KL sums then add up over the CP group); rewards are counted by one CP rank only.
        masks = cp_local(whole, rollout_data["total_lengths"], rollout_data["response_lengths"])
        raw_rewards = raw_rewards if cp_rank() == 0 else None
    rollout_ids = rollout_data.get("rollout_ids") or list(range(n))
    defer = mopd_args(args).mopd_defer_rollout_metrics
    metrics = mopd_teacher_metrics(
        teacher_ids=[str(t) for t in teacher_ids],
        rollout_ids=[int(r) for r in rollout_ids],
        loss_masks=masks,
        trainable_tokens=trainable,
        sample_denoms=torch.as_tensor(denoms, dtype=torch.float32).cpu(),
        reverse_kl=[
            (s.float() - t.float().to(s.device)).detach()
            for s, t in zip(student, teacher, strict=True)
        ],
        raw_rewards=raw_rewards,
        sums_out=deferred_store() if defer else None,
    )
    if defer:  # the slime actor combines and logs them after the step (mopd_metrics)
        return
    for key, value in metrics.items():
        rollout_data[key] = torch.tensor(value, dtype=torch.float32)


def _cat(values: Sequence[Tensor] | Tensor | None, key: str, device: torch.device) -> Tensor:
    if values is None:
        raise KeyError(f"mopd_policy_loss: the loss batch has no {key!r}")
    if isinstance(values, Tensor):
        return values.reshape(-1).to(device)
    return torch.cat([torch.as_tensor(v).reshape(-1) for v in values]).to(device)


def mopd_policy_loss(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, sum_of_sample_mean: Reducer
) -> tuple[Tensor, dict[str, Tensor]]:
    """slime's ``--custom-loss-function-path`` hook: ``-A_t * log pi_student`` reduced.

    With ``--mopd-objective dense`` the loss is instead the reverse KL over the vocabulary
    (:func:`dressage.training.mopd_dense.dense_reverse_kl_loss`), with ``topk`` the KL over the
    teacher's top-K support and a tail bucket
    (:func:`dressage.training.mopd_topk.topk_kl_loss`); the advantages are then unused by the
    loss (optional in the batch, reported when present).

    Args:
        batch: ``advantages`` (from :func:`compute_mopd_advantages`), ``total_lengths``,
            ``response_lengths``, tokens; ``teacher_full_log_probs`` (``[R_i, V]`` per sample)
            with ``dense``; ``teacher_log_probs`` carrying each sample's top-k support with
            ``topk``; for metrics ``teacher_log_probs`` and ``log_probs``.
        logits: packed ``[1, T, V]`` (see ``dressage.training.log_probs``).

    Returns:
        ``(loss, metrics)``; metrics ``mopd_loss``, ``mopd_reverse_kl`` (sampled-token
        ``log pi_student - log pi_teacher``), ``mopd_advantage_mean``, ``mopd_advantage_abs_mean``,
        ``mopd_advantage_clipfrac`` and ``mopd_update_kl`` (k3 KL of the current student from the
        one that generated the advantages), each reduced like the loss; with ``dense`` also
        ``mopd_dense_reverse_kl``, with ``topk`` ``mopd_topk_kl`` (the loss itself) and
        ``mopd_topk_teacher_tail_mass`` / ``mopd_topk_student_tail_mass`` (each distribution's
        mass outside the support: how much a larger K could still resolve).
    """
    compute = log_prob_function(args)
    objective = mopd_objective(args)
    if objective == "topk":
        # the student's sampled-token log-probs come free with the loss (no second pass)
        loss, parts, support = topk_kl_loss(args, batch, logits, sum_of_sample_mean)
        current = parts.student_log_probs
        tail = support.tail.to(current.device).float()
        metrics = {
            "mopd_loss": loss.detach(),
            "mopd_topk_kl": loss.detach(),
            # how much of each distribution the support leaves out (is K large enough?)
            "mopd_topk_teacher_tail_mass": sum_of_sample_mean(tail.exp()),
            "mopd_topk_student_tail_mass": sum_of_sample_mean(parts.student_tail.exp()),
        }
        if batch.get("advantages") is not None:
            advantages = _cat(batch["advantages"], "advantages", current.device).float()
            metrics |= _advantage_metrics(advantages, sum_of_sample_mean)
    elif objective == "dense":
        loss = dense_reverse_kl_loss(args, batch, logits, sum_of_sample_mean)
        with torch.no_grad():
            current = torch.cat(compute(args, batch, logits.detach(), with_entropy=False)[0])
        metrics = {"mopd_loss": loss.detach(), "mopd_dense_reverse_kl": loss.detach()}
        if batch.get("advantages") is not None:
            advantages = _cat(batch["advantages"], "advantages", current.device).float()
            metrics |= _advantage_metrics(advantages, sum_of_sample_mean)
    else:
        log_probs = torch.cat(compute(args, batch, logits, with_entropy=False)[0])
        advantages = _cat(batch.get("advantages"), "advantages", log_probs.device).float().detach()
        loss = sum_of_sample_mean(-advantages * log_probs)
        current = log_probs.detach()
        metrics = {"mopd_loss": loss.detach(), **_advantage_metrics(advantages, sum_of_sample_mean)}
    metrics |= _sampled_token_metrics(args, batch, current, sum_of_sample_mean)
    return loss, metrics


def _advantage_metrics(advantages: Tensor, sum_of_sample_mean: Reducer) -> dict[str, Tensor]:
    return {
        "mopd_advantage_mean": sum_of_sample_mean(advantages),
        "mopd_advantage_abs_mean": sum_of_sample_mean(advantages.abs()),
    }


def _sampled_token_metrics(
    args: Namespace, batch: Mapping[str, Any], current: Tensor, sum_of_sample_mean: Reducer
) -> dict[str, Tensor]:
    """The sampled-token reverse KL, the update KL and the clip fraction (``current``: the
    student's response log-probs now, detached)."""
    device = current.device
    metrics: dict[str, Tensor] = {}
    teacher = batch.get("teacher_log_probs")
    if teacher is not None:
        teacher_flat = _cat(teacher, "teacher_log_probs", device).float()
        metrics["mopd_reverse_kl"] = sum_of_sample_mean(current - teacher_flat)
    old = batch.get(_student_key(args))
    if old is not None:
        old_flat = _cat(old, _student_key(args), device).float()
        metrics["mopd_update_kl"] = sum_of_sample_mean(approx_kl(current, old_flat, "k3"))
        if teacher is not None:
            gap = (teacher_flat - old_flat).abs()
            metrics["mopd_advantage_clipfrac"] = sum_of_sample_mean((gap > _clip(args)).float())
    return metrics
