"""One MOPD training step through slime's loss path, on CPU processes with gloo.

Each rank (``torch.multiprocessing.spawn``) initialises megatron-core's parallel state with the
requested TP and CP, builds the logits Megatron would hand it (its vocabulary shard, its CP slice
of each packed sequence), and runs what slime's Megatron actor runs around a step:
``compute_advantages_and_returns`` (slime's, which calls the MOPD advantage hook named in
``args``), then ``loss_function`` (slime's, which calls the MOPD loss hook), backward, and
slime's ``reduce_train_step_metrics`` over the data-parallel-with-CP group. It returns the
scaled loss, the reduced metrics and the gradient of its logits, mapped back to global
(token, vocabulary) positions, so the caller can add the ranks up and compare with a
single-process full-vocabulary reference (:func:`reference`, :func:`topk_reference`).

One spawned run steps through every case of :data:`CASES` (the objective and its options), so a
layout costs one set of processes. For ``--mopd-objective topk`` the rank first scores its
teacher the way the MOPD actor's teacher pass does: the post-forward function slime's
``forward_only`` calls (``dressage.training.topk_teacher_pass.log_probs_and_support``) on the
teacher's logits shard at the rank's CP slice, the support hung on each sample's teacher
log-probs (``with_supports``).
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Any

import torch

VOCAB = 48
CLIP = 0.7
TEMPERATURE = 0.9
GLOBAL_BATCH = 2  # rollouts per step
TEACHERS = ("calc", "look")

CASES: dict[str, dict[str, Any]] = {
    "sampled": {"mopd_objective": "sampled"},
    "topk-k1": {"mopd_objective": "topk", "mopd_topk": 1},
    "topk-k8": {"mopd_objective": "topk", "mopd_topk": 8},
    "topk-kV": {"mopd_objective": "topk", "mopd_topk": VOCAB},
    # a forward-KL share, and chunks of 5 rows through the teacher pass and the loss
    "topk-k8-b0.5": {
        "mopd_objective": "topk",
        "mopd_topk": 8,
        "mopd_forward_kl_weight": 0.5,
        "log_probs_chunk_size": 5,
    },
}
"""Each case's slime options on top of :func:`slime_args`."""


def batch_spec(seed: int = 0) -> dict[str, Any]:
    """A deterministic step: 4 samples of 3 rollouts (rollout 1 split in two segments)."""
    g = torch.Generator().manual_seed(seed)
    totals, responses = [11, 9, 14, 7], [6, 4, 9, 3]
    samples = []
    for i, (total, resp) in enumerate(zip(totals, responses, strict=True)):
        mask = (torch.rand(resp, generator=g) > 0.25).int()
        mask[-1] = 1
        samples.append(
            {
                "tokens": torch.randint(0, VOCAB, (total,), generator=g),
                "logits": torch.randn(total, VOCAB, generator=g) * 2.0,
                "teacher": torch.log_softmax(torch.randn(resp, VOCAB, generator=g), -1)[:, 0],
                "old_shift": torch.randn(resp, generator=g) * 0.3,
                "mask": mask,
                "teacher_id": TEACHERS[i % 2] if i != 2 else TEACHERS[1],
            }
        )
    # the teacher's own logits, for the top-k teacher pass (drawn apart: the rest stays as is)
    t = torch.Generator().manual_seed(seed + 1)
    for sample, total in zip(samples, totals, strict=True):
        sample["teacher_logits"] = torch.randn(total, VOCAB, generator=t) * 2.0
    rollout_ids = [0, 1, 1, 2]
    # prompt-equal-like denominators: shared by a rollout's segments
    denoms = {0: 5.0, 1: 11.0, 2: 2.5}
    return {
        "samples": samples,
        "total_lengths": totals,
        "response_lengths": responses,
        "rollout_ids": rollout_ids,
        "rollout_mask_sums": [denoms[r] for r in rollout_ids],
        "raw_reward": [1.0, 0.0, 1.0, 0.0],
    }


def slime_args(metrics_dir: str = ".", **case: Any) -> Namespace:
    """The slime options a MOPD step reads on this path (``case``: a case's own)."""
    from tests.real_slime.slime_parts import MOPD_LOSS_ARGS

    values: dict[str, Any] = dict(
        MOPD_LOSS_ARGS,
        mopd_advantage_clip=CLIP,
        mopd_defer_rollout_metrics=True,
        calculate_per_token_loss=False,
        recompute_loss_function=False,
        rollout_temperature=TEMPERATURE,
        mopd_metrics_dir=metrics_dir,
    )
    return Namespace(**(values | case))


def _student_full(spec: dict[str, Any]) -> list[torch.Tensor]:
    """Each sample's sampled-token log-probs under its full logits (the reference's view)."""
    out = []
    for s, total, resp in zip(
        spec["samples"], spec["total_lengths"], spec["response_lengths"], strict=True
    ):
        logp = torch.log_softmax(s["logits"].double() / TEMPERATURE, -1)
        rows = torch.arange(total - resp - 1, total - 1)
        out.append(logp[rows, s["tokens"][total - resp :]])
    return out


def reference(spec: dict[str, Any]) -> dict[str, Any]:
    """The step in float64, one process, full vocabulary, written from the MOPD formula:
    A = clip(log pi_T - log pi_old, +-c); L = sum_i sum_t m (-A log pi) / max(d_i, 1) / G."""
    logits = [s["logits"].double().clone().requires_grad_(True) for s in spec["samples"]]
    loss = torch.zeros((), dtype=torch.float64)
    kl = torch.zeros((), dtype=torch.float64)
    per_teacher: dict[str, list[float]] = {}
    for i, s in enumerate(spec["samples"]):
        total, resp = spec["total_lengths"][i], spec["response_lengths"][i]
        logp_all = torch.log_softmax(logits[i] / TEMPERATURE, -1)
        logp = logp_all[torch.arange(total - resp - 1, total - 1), s["tokens"][total - resp :]]
        old = logp.detach() + s["old_shift"].double()
        adv = (s["teacher"].double() - old).clamp(-CLIP, CLIP)
        m, d = s["mask"].double(), max(spec["rollout_mask_sums"][i], 1.0)
        loss = loss + (m * (-adv * logp)).sum() / d
        kl = kl + (m * (logp.detach() - s["teacher"].double())).sum() / d
        num, den = per_teacher.setdefault(s["teacher_id"], [0.0, 0.0])
        old_kl = float((m * (old - s["teacher"].double())).sum()) / d
        per_teacher[s["teacher_id"]] = [num + old_kl, den + float(m.sum()) / d]
    loss = loss / GLOBAL_BATCH
    loss.backward()
    return {
        "loss": float(loss.detach()),
        "reverse_kl": float(kl) / GLOBAL_BATCH,
        "teacher_kl": {t: num / den for t, (num, den) in per_teacher.items()},
        "grad": torch.cat([g.grad for g in logits]).float(),
    }


def bucket_kl(
    log_s: torch.Tensor, log_t: torch.Tensor, targets: torch.Tensor, k: int, b: float
) -> torch.Tensor:
    """Per row, the top-k objective's formula (``dressage.training.mopd_topk``), plainly: the
    buckets are the teacher's K most likely tokens over the whole vocabulary, the sampled token
    and one tail bucket of the rest; ``(1 - b) KL(pS || pT) + b KL(pT || pS)`` over them.

    Args:
        log_s, log_t: ``[N, V]`` the student's and the teacher's log-probs (whole vocabulary).
        targets: ``[N]`` the sampled tokens.
    """
    out = []
    for i in range(log_s.shape[0]):
        support = list(dict.fromkeys(log_t[i].topk(k).indices.tolist() + [int(targets[i])]))
        rest = [v for v in range(log_s.shape[1]) if v not in support]
        s, t = (
            torch.stack(
                [row[v] for v in support] + ([torch.logsumexp(row[rest], 0)] if rest else [])
            )
            for row in (log_s[i], log_t[i])
        )
        out.append((1 - b) * (s.exp() * (s - t)).sum() + b * (t.exp() * (t - s)).sum())
    return torch.stack(out)


def topk_reference(spec: dict[str, Any], k: int, b: float = 0.0) -> dict[str, Any]:
    """The top-k step in float64, one process, full vocabulary (:func:`bucket_kl`):
    L = sum_i sum_t m KL_t / max(d_i, 1) / G; the sampled-token reverse KL against the teacher's
    own logits."""
    logits = [s["logits"].double().clone().requires_grad_(True) for s in spec["samples"]]
    loss = torch.zeros((), dtype=torch.float64)
    kl = torch.zeros((), dtype=torch.float64)
    for i, s in enumerate(spec["samples"]):
        total, resp = spec["total_lengths"][i], spec["response_lengths"][i]
        rows = torch.arange(total - resp - 1, total - 1)
        targets = s["tokens"][total - resp :]
        log_s = torch.log_softmax(logits[i][rows] / TEMPERATURE, -1)
        log_t = torch.log_softmax(s["teacher_logits"].double()[rows] / TEMPERATURE, -1)
        m, d = s["mask"].double(), max(spec["rollout_mask_sums"][i], 1.0)
        loss = loss + (m * bucket_kl(log_s, log_t, targets, k, b)).sum() / d
        picked = torch.arange(resp), targets
        kl = kl + (m * (log_s.detach()[picked] - log_t[picked])).sum() / d
    loss = loss / GLOBAL_BATCH
    loss.backward()
    return {
        "loss": float(loss.detach()),
        "reverse_kl": float(kl) / GLOBAL_BATCH,
        "grad": torch.cat([g.grad for g in logits]).float(),
    }


def _local_rows(spec: dict[str, Any]) -> list[torch.Tensor]:
    """Per sample, the global packed row of each local logits row (-1 for padding)."""
    from slime.backends.megatron_utils.cp_utils import slice_with_cp

    out, offset = [], 0
    for total in spec["total_lengths"]:
        out.append(slice_with_cp(torch.arange(offset, offset + total), -1))
        offset += total
    return out


def _rank(rank: int, world: int, port: int, tp: int, cp: int, out: str, queue: Any) -> None:
    import torch.distributed as dist

    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        from megatron.core import parallel_state as mpu

        mpu.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
        queue.put((rank, {name: _step(tp, cp, os.path.join(out, name), name) for name in CASES}))
    except BaseException as exc:  # reported to the parent, which fails the test with it
        import traceback

        queue.put((rank, {"error": f"{exc!r}\n{traceback.format_exc()}"}))
    finally:
        dist.destroy_process_group()


def _local_logits(full: torch.Tensor, flat_rows: torch.Tensor, shard: slice) -> torch.Tensor:
    """``[1, rows, V / TP]``: the packed ``full`` logits at this rank's rows and columns (0 at
    padding rows), as Megatron's output layer hands them to a rank."""
    local = torch.where(flat_rows[:, None] >= 0, full[flat_rows.clamp_min(0)], 0.0)[:, shard]
    return local.clone().unsqueeze(0)


def _step(tp: int, cp: int, out: str, case: str) -> dict[str, Any]:
    from megatron.core import parallel_state as mpu
    from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp
    from slime.backends.megatron_utils.loss import compute_advantages_and_returns, loss_function
    from slime.observability.train_metric_utils import reduce_train_step_metrics

    from dressage.training.topk_teacher_pass import log_probs_and_support, with_supports

    spec, args = batch_spec(), slime_args(out, **CASES[case])
    tp_rank = mpu.get_tensor_model_parallel_rank()
    shard = slice(tp_rank * VOCAB // tp, (tp_rank + 1) * VOCAB // tp)
    flat_rows = torch.cat(_local_rows(spec))
    samples = spec["samples"]
    full = torch.cat([s["logits"] for s in samples])
    logits = _local_logits(full, flat_rows, shard).requires_grad_(True)

    totals, resps = spec["total_lengths"], spec["response_lengths"]
    tokens = [x["tokens"] for x in samples]
    student = _student_full(spec)

    def cp_slice(values: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            slice_log_prob_with_cp(v.float(), t, r)
            for v, t, r in zip(values, totals, resps, strict=True)
        ]

    if args.mopd_objective == "topk":
        # the MOPD actor's teacher pass: forward_only's post-forward function on the teacher's
        # shard of this rank's CP slice, then each sample's support on its teacher log-probs
        teacher_logits = _local_logits(
            torch.cat([x["teacher_logits"] for x in samples]), flat_rows, shard
        )
        _, stored = log_probs_and_support(
            teacher_logits,
            args=args,
            unconcat_tokens=tokens,
            total_lengths=totals,
            response_lengths=resps,
            with_entropy=False,
        )
        teacher = with_supports(stored)
        assert teacher is not None
    else:
        teacher = cp_slice([x["teacher"] for x in samples])
    rollout_data: dict[str, Any] = {
        # what slime's compute_log_prob leaves: CP-local log-probs of the old student and, from
        # the MOPD actor's teacher passes, of each sample's teacher
        "log_probs": cp_slice(
            [(s + x["old_shift"].double()) for s, x in zip(student, samples, strict=True)]
        ),
        "teacher_log_probs": teacher,
        "loss_masks": [x["mask"] for x in samples],
        "total_lengths": totals,
        "response_lengths": resps,
        "rollout_mask_sums": torch.tensor(spec["rollout_mask_sums"]),
        "rollout_ids": spec["rollout_ids"],
        "prompt": [x["teacher_id"] for x in samples],
        "raw_reward": spec["raw_reward"],
    }
    compute_advantages_and_returns(args, rollout_data)
    batch = {
        "unconcat_tokens": tokens,
        "total_lengths": totals,
        "response_lengths": resps,
        "loss_masks": rollout_data["loss_masks"],
        "rollout_mask_sums": rollout_data["rollout_mask_sums"],
        "advantages": rollout_data["advantages"],
        "log_probs": rollout_data["log_probs"],
        "teacher_log_probs": rollout_data["teacher_log_probs"],
    }
    loss, _, log = loss_function(args, batch, 1, GLOBAL_BATCH, logits)
    loss.backward()
    metrics = reduce_train_step_metrics(
        [log],
        calculate_per_token_loss=False,
        step_global_batch_size=GLOBAL_BATCH,
        cp_size=cp,
        dp_with_cp_group=mpu.get_data_parallel_group(with_context_parallel=True),
    )
    assert logits.grad is not None
    grad = torch.zeros(full.shape[0], VOCAB)
    keep = flat_rows >= 0
    grad[flat_rows[keep][:, None], torch.arange(VOCAB)[shard][None, :]] = logits.grad[0][keep]
    from dressage.training.mopd_actor import log_teacher_metrics

    mopd = log_teacher_metrics(args, 0)  # what the actor logs after the step (one writer)
    return {
        "tp_rank": tp_rank,
        "cp_rank": mpu.get_context_parallel_rank(),
        "loss": float(loss.detach()),
        "metrics": metrics,
        "grad": grad.tolist(),  # plain data: tensors in a queue outlive their process badly
        "mopd": mopd,
    }


def run(out: str, tp: int = 1, cp: int = 1, port: int = 0) -> list[dict[str, dict[str, Any]]]:
    """Run every case of :data:`CASES` on ``tp x cp`` processes (teacher metrics under
    ``out/<case>``); per rank, in rank order, each case's result."""
    import torch.multiprocessing as mp

    from tests.helpers import free_port

    world = tp * cp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = port or free_port()
    procs = mp.start_processes(
        _rank,
        args=(world, port, tp, cp, out, queue),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    # read before joining: a rank's result is larger than a pipe's buffer, so its put blocks
    # until the parent reads it
    results = dict(queue.get() for _ in range(world))
    while not procs.join():
        pass
    errors = [r["error"] for r in results.values() if "error" in r]
    if errors:
        raise RuntimeError("a rank failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world)]


def combine(results: list[dict[str, Any]], cp: int) -> dict[str, Any]:
    """The ranks' contributions to one case as one step: gradient and loss as the optimizer
    sees them.

    TP shards fill disjoint vocabulary columns; CP ranks add up, and Megatron's gradient
    average over the data-parallel-with-CP group divides by ``cp`` what slime's loss scaling
    multiplied in.
    """
    grad = torch.zeros(len(results[0]["grad"]), VOCAB)
    loss = 0.0
    for r in results:
        grad += torch.tensor(r["grad"])
        if r["tp_rank"] == 0:
            loss += r["loss"]
    return {"grad": grad / cp, "loss": loss / cp}
