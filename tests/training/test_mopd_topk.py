"""The top-k MOPD objective: the bucketed KL, its gradient, its support, TP=2 over gloo.

The reference is written from the formula in float64 on one process with the whole vocabulary
(``_reference``); the code under test is ``dressage.training.mopd_topk`` through the loss hook.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest
import torch

from dressage.training.mopd_dense import reverse_kl
from dressage.training.mopd_loss import compute_mopd_advantages, mopd_policy_loss
from dressage.training.mopd_topk import (
    TeacherSupport,
    attach_support,
    mopd_topk,
    support_of,
    teacher_support,
    topk_kl,
)
from dressage.training.reducer import get_sum_of_sample_mean

pytestmark = pytest.mark.unit

V = 13
TEMPERATURE = 0.8


def _reference(
    student: torch.Tensor, teacher: torch.Tensor, targets: torch.Tensor, k: int, b: float
) -> torch.Tensor:
    """Per row, float64: buckets = the teacher's top-k, the sampled token, the rest."""
    log_s = torch.log_softmax(student.double() / TEMPERATURE, -1)
    log_t = torch.log_softmax(teacher.double() / TEMPERATURE, -1)

    def buckets(lp: torch.Tensor, support: list[int], rest: list[int]) -> torch.Tensor:
        tail = [torch.logsumexp(lp[rest], 0)] if rest else []
        return torch.stack([lp[v] for v in support] + tail)

    out = []
    for i in range(student.shape[0]):
        support = list(dict.fromkeys(log_t[i].topk(k).indices.tolist() + [int(targets[i])]))
        rest = [v for v in range(student.shape[1]) if v not in support]
        s, t = buckets(log_s[i], support, rest), buckets(log_t[i], support, rest)
        reverse = (s.exp() * (s - t)).sum()
        forward = (t.exp() * (t - s)).sum()
        out.append((1 - b) * reverse + b * forward)
    return torch.stack(out)


def _rows(seed: int = 0, n: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, V, generator=g) * 3,
        torch.randn(n, V, generator=g) * 3,
        torch.randint(0, V, (n,), generator=g),
    )


@pytest.mark.parametrize("k", [1, 4, V])
@pytest.mark.parametrize("b", [0.0, 0.5])
def test_bucketed_kl_and_gradient_equal_the_float64_formula(k: int, b: float) -> None:
    student, teacher, targets = _rows()
    rows = torch.arange(student.shape[0])
    support, target_lp = teacher_support(teacher, rows, targets, k, temperature=TEMPERATURE)
    x = student.clone().requires_grad_(True)
    out = topk_kl(
        x, rows, targets, support, target_lp, temperature=TEMPERATURE, forward_weight=b,
        chunk_tokens=4,  # two chunks, the second partial
    )  # fmt: skip
    (grad,) = torch.autograd.grad(out.sum(), x)
    ref_x = student.double().clone().requires_grad_(True)
    expected = _reference(ref_x, teacher, targets, k, b)
    (ref_grad,) = torch.autograd.grad(expected.sum(), ref_x)
    assert expected.min().item() > 0.05  # a real gap in every row
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-5)


def test_the_support_keeps_k_values_a_position_and_the_teachers_exact_log_probs() -> None:
    _, teacher, targets = _rows(seed=1)
    rows = torch.tensor([0, 2, 5])
    support, target_lp = teacher_support(teacher, rows, targets[rows], 3, temperature=TEMPERATURE)
    full = torch.log_softmax(teacher[rows] / TEMPERATURE, -1)
    assert support.ids.shape == support.log_probs.shape == (3, 3)
    assert support.ids.dtype == torch.int32 and support.tail.shape == (3,)
    torch.testing.assert_close(support.log_probs, full.gather(-1, support.ids.long()))
    torch.testing.assert_close(support.ids.long(), full.topk(3).indices)
    torch.testing.assert_close(target_lp, full.gather(-1, targets[rows, None]).squeeze(-1))
    inside = torch.zeros_like(full, dtype=torch.bool)
    inside.scatter_(-1, support.ids.long(), True)
    inside.scatter_(-1, targets[rows, None], True)
    expected_tail = torch.logsumexp(full.masked_fill(inside, float("-inf")), -1)
    torch.testing.assert_close(support.tail, expected_tail)
    whole, _ = teacher_support(teacher, rows, targets[rows], V)
    assert torch.isneginf(whole.tail).all()  # K = V: nothing is left outside


def test_a_tiny_tail_stays_finite() -> None:
    teacher = torch.full((1, V), -200.0)
    teacher[0, 0] = 200.0  # everything but token 0 is ~e^-400 below it: exp underflows
    support, _ = teacher_support(teacher, torch.tensor([0]), torch.tensor([1]), 1)
    assert torch.isfinite(support.tail).all() and support.tail.item() < -300
    student = torch.zeros(1, V, requires_grad=True)
    out = topk_kl(student, torch.tensor([0]), torch.tensor([1]), support, torch.tensor([-400.0]))
    out.sum().backward()
    assert torch.isfinite(out).all() and student.grad is not None
    assert torch.isfinite(student.grad).all()


def test_a_student_with_a_vanishing_tail_gets_the_forward_kls_exact_pull() -> None:
    """The student puts ~e^-150 on the tail (it underflows against its maximum) while the
    teacher puts real mass there: the forward share's gradient on the tail tokens is finite and
    equals the float64 formula."""
    _, teacher, targets = _rows(seed=3, n=3)
    rows = torch.arange(3)
    support, target_lp = teacher_support(teacher, rows, targets, 2, temperature=TEMPERATURE)
    student = torch.full((3, V), -60.0)
    student.scatter_(-1, support.ids[:, :1].long(), 60.0)  # sure of the teacher's favourite
    x = student.clone().requires_grad_(True)
    out = topk_kl(x, rows, targets, support, target_lp, temperature=TEMPERATURE, forward_weight=0.5)
    (grad,) = torch.autograd.grad(out.sum(), x)
    ref_x = student.double().clone().requires_grad_(True)
    expected = _reference(ref_x, teacher, targets, 2, 0.5)
    (ref_grad,) = torch.autograd.grad(expected.sum(), ref_x)
    assert ref_grad.abs().max() > 0.01  # the pull is real
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-6)


def test_student_equal_to_teacher_has_zero_loss_and_gradient() -> None:
    _, teacher, targets = _rows(seed=2)
    rows = torch.arange(teacher.shape[0])
    support, target_lp = teacher_support(teacher, rows, targets, 2, temperature=TEMPERATURE)
    x = teacher.clone().requires_grad_(True)
    out = topk_kl(x, rows, targets, support, target_lp, temperature=TEMPERATURE, forward_weight=0.3)
    out.sum().backward()
    assert out.abs().max().item() < 1e-6
    assert x.grad is not None and x.grad.abs().max().item() < 1e-6


def test_bad_k_and_weight_are_refused_naming_them() -> None:
    _, teacher, targets = _rows()
    rows = torch.arange(2)
    with pytest.raises(ValueError, match="--mopd-topk 0 must be between 1 and the vocabulary"):
        teacher_support(teacher, rows, targets[:2], 0)
    with pytest.raises(ValueError, match=f"--mopd-topk {V + 1} must be between 1 and .* {V}"):
        teacher_support(teacher, rows, targets[:2], V + 1)
    with pytest.raises(ValueError, match="--mopd-topk must be at least 1, got 0"):
        mopd_topk(Namespace(mopd_topk=0))
    support, lp = teacher_support(teacher, rows, targets[:2], 2)
    with pytest.raises(ValueError, match="forward_weight must be in"):
        topk_kl(teacher, rows, targets[:2], support, lp, forward_weight=1.5)
    with pytest.raises(ValueError, match="covers 2 positions .* the student's response has 3"):
        topk_kl(teacher, torch.arange(3), targets[:3], support, lp)
    with pytest.raises(ValueError, match=r"ids \[2, 2\], log_probs \[2, 3\]"):
        TeacherSupport(support.ids, torch.zeros(2, 3), support.tail)


# --- through the loss hook ---------------------------------------------------------------------

LOGIT_ROWS = [[1, 2, 3], [6, 7]]  # rows of the packed logits that predict each response token


def _args(**overrides: Any) -> Namespace:
    values = {"rollout_temperature": TEMPERATURE, "mopd_objective": "topk", "mopd_topk": 3}
    return Namespace(**(values | overrides))


def _hook_case(k: int) -> tuple[dict[str, Any], torch.Tensor, list[torch.Tensor]]:
    """Two samples (totals 5 and 4, responses 3 and 2, one masked token), packed logits
    ``[1, 9, V]`` and the teacher's logits at the response positions."""
    g = torch.Generator().manual_seed(3)
    tokens = [torch.randint(0, V, (5,), generator=g), torch.randint(0, V, (4,), generator=g)]
    logits = (3 * torch.randn(1, 9, V, generator=g)).requires_grad_()
    teacher_logits = [3 * torch.randn(len(r), V, generator=g) for r in LOGIT_ROWS]
    teacher = []
    for t, z in zip(tokens, teacher_logits, strict=True):
        y = t[-z.shape[0] :]
        support, lp = teacher_support(
            z, torch.arange(z.shape[0]), y, k, temperature=TEMPERATURE
        )  # fmt: skip
        teacher.append(attach_support(lp, support))
    batch: dict[str, Any] = {
        "unconcat_tokens": tokens,
        "total_lengths": [5, 4],
        "response_lengths": [3, 2],
        "loss_masks": [torch.tensor([1, 0, 1]), torch.tensor([1, 1])],
        "rollout_mask_sums": None,
        "teacher_log_probs": teacher,
        "log_probs": [lp.detach().clone() for lp in teacher],  # any old log-probs will do
    }
    rollout: dict[str, Any] = {"log_probs": batch["log_probs"], "teacher_log_probs": teacher}
    compute_mopd_advantages(_args(), rollout)
    batch["advantages"] = rollout["advantages"]
    return batch, logits, teacher_logits


def _hook(batch: dict[str, Any], logits: torch.Tensor, **args: Any) -> tuple[Any, Any]:
    reducer = get_sum_of_sample_mean(
        batch["total_lengths"], batch["response_lengths"], batch["loss_masks"]
    )
    return mopd_policy_loss(_args(**args), batch, logits, reducer)


def test_the_hook_reduces_the_bucketed_kl_like_slime() -> None:
    batch, logits, teacher_logits = _hook_case(k=3)
    loss, metrics = _hook(batch, logits, mopd_topk=3)
    per_sample = []
    for rows, z, t, mask in zip(
        LOGIT_ROWS, teacher_logits, batch["unconcat_tokens"], batch["loss_masks"], strict=True
    ):
        kl = _reference(logits.detach()[0, rows], z, t[-len(rows) :], 3, 0.0)
        per_sample.append((kl * mask).sum() / mask.sum())
    assert loss.item() == pytest.approx(float(sum(per_sample)), rel=1e-5)
    assert metrics["mopd_topk_kl"].item() == metrics["mopd_loss"].item() == loss.item()
    assert {"mopd_reverse_kl", "mopd_update_kl", "mopd_advantage_mean"} <= set(metrics)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad[0, 2].abs().max() == 0.0  # the masked token's row gets nothing
    assert grad[0, 1].abs().max() > 0.0


def test_the_hook_reports_what_the_support_leaves_out_and_the_sampled_kl() -> None:
    """The student's sampled-token log-probs (free with the loss) and both tail masses, reduced
    like the loss, against plain log-softmax sums."""
    batch, logits, teacher_logits = _hook_case(k=2)
    _, metrics = _hook(batch, logits, mopd_topk=2)
    sums = {"reverse": 0.0, "teacher_tail": 0.0, "student_tail": 0.0}
    for rows, z, t, mask, lp in zip(
        LOGIT_ROWS,
        teacher_logits,
        batch["unconcat_tokens"],
        batch["loss_masks"],
        batch["teacher_log_probs"],
        strict=True,
    ):
        y = t[-len(rows) :]
        log_s = torch.log_softmax(logits.detach()[0, rows].double() / TEMPERATURE, -1)
        log_t = torch.log_softmax(z.double() / TEMPERATURE, -1)
        inside = torch.zeros_like(log_t, dtype=torch.bool)
        inside.scatter_(-1, log_t.topk(2).indices, True)
        inside.scatter_(-1, y[:, None], True)
        m = mask.double()
        picked = log_s.gather(-1, y[:, None]).squeeze(-1)
        sums["reverse"] += float((m * (picked - lp.double())).sum() / m.sum())
        for name, lps in (("teacher_tail", log_t), ("student_tail", log_s)):
            mass = lps.exp().masked_fill(inside, 0.0).sum(-1)
            sums[name] += float((m * mass).sum() / m.sum())
    assert metrics["mopd_reverse_kl"].item() == pytest.approx(sums["reverse"], rel=1e-5)
    assert sums["teacher_tail"] > 0.01 and sums["student_tail"] > 0.01
    for name in ("teacher_tail", "student_tail"):
        got = metrics[f"mopd_topk_{name}_mass"].item()
        assert got == pytest.approx(sums[name], rel=1e-5), name


@pytest.mark.parametrize("b", [0.0, 0.5])
def test_with_k_equal_to_the_vocabulary_topk_is_dense(b: float) -> None:
    batch, logits, teacher_logits = _hook_case(k=V)
    loss, _ = _hook(batch, logits, mopd_topk=V, mopd_forward_kl_weight=b)
    (grad,) = torch.autograd.grad(loss, logits)
    dense_batch = batch | {
        "teacher_full_log_probs": [torch.log_softmax(z / TEMPERATURE, -1) for z in teacher_logits]
    }
    dense, _ = _hook(dense_batch, logits, mopd_objective="dense", mopd_forward_kl_weight=b)
    (dense_grad,) = torch.autograd.grad(dense, logits)
    assert loss.item() == pytest.approx(dense.item(), rel=1e-5)
    torch.testing.assert_close(grad, dense_grad, rtol=1e-4, atol=1e-6)


def test_a_batch_without_supports_is_refused_naming_the_sample() -> None:
    batch, logits, _ = _hook_case(k=3)
    batch["teacher_log_probs"] = [batch["teacher_log_probs"][0], torch.zeros(2)]
    with pytest.raises(KeyError, match="sample 1 of the micro-batch has none"):
        _hook(batch, logits)
    assert support_of(torch.zeros(2)) is None


def test_dense_equals_topk_at_k_v_through_the_shared_reverse_kl() -> None:
    student, teacher, targets = _rows(seed=4)
    rows = torch.arange(student.shape[0])
    support, lp = teacher_support(teacher, rows, targets, V, temperature=TEMPERATURE)
    topk = topk_kl(student, rows, targets, support, lp, temperature=TEMPERATURE)
    dense = reverse_kl(
        student, rows, torch.log_softmax(teacher / TEMPERATURE, -1), temperature=TEMPERATURE
    )
    torch.testing.assert_close(topk, dense, rtol=1e-5, atol=1e-6)


# --- TP = 2 over gloo ------------------------------------------------------------------------

TP_VOCAB = 12  # two shards of 6 columns


def _tp_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return (
        torch.randn(7, TP_VOCAB, generator=g) * 3,
        torch.randn(7, TP_VOCAB, generator=g) * 3,
        torch.randint(0, TP_VOCAB, (7,), generator=g),
    )


def _tp_rank(rank: int, port: int, k: int, b: float, queue: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        student, teacher, targets = _tp_rows()
        rows = torch.arange(student.shape[0])
        width = TP_VOCAB // 2
        shard = slice(rank * width, (rank + 1) * width)
        shared: dict[str, Any] = {
            "temperature": TEMPERATURE, "group": dist.group.WORLD, "vocab_start": shard.start,
            "chunk_tokens": 3,
        }  # fmt: skip
        support, lp = teacher_support(teacher[:, shard], rows, targets, k, **shared)
        x = student[:, shard].clone().requires_grad_(True)
        out = topk_kl(x, rows, targets, support, lp, forward_weight=b, **shared)
        out.sum().backward()
        assert x.grad is not None
        result = {"ids": support.ids.tolist(), "out": out.tolist(), "grad": x.grad.tolist()}
        queue.put((rank, result))
    except BaseException as exc:  # the parent fails the test with it
        queue.put((rank, {"error": repr(exc)}))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("k", "b"), [(1, 0.0), (5, 0.5), (TP_VOCAB, 0.0)])
def test_two_vocab_shards_over_gloo_equal_one_rank(k: int, b: float) -> None:
    """Each rank holds half the vocabulary; the global top-k, normaliser and tail are reduced
    across the two, and the shards' gradients side by side are the one-rank gradient."""
    import torch.multiprocessing as mp

    from tests.helpers import free_port

    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _tp_rank, args=(free_port(), k, b, queue), nprocs=2, join=True, start_method="spawn"
    )
    results = dict(queue.get() for _ in range(2))
    assert not any("error" in r for r in results.values()), results
    student, teacher, targets = _tp_rows()
    rows = torch.arange(student.shape[0])
    support, lp = teacher_support(teacher, rows, targets, k, temperature=TEMPERATURE)
    x = student.clone().requires_grad_(True)
    out = topk_kl(x, rows, targets, support, lp, temperature=TEMPERATURE, forward_weight=b)
    out.sum().backward()
    assert x.grad is not None
    for r in (0, 1):
        assert results[r]["ids"] == support.ids.tolist()
        torch.testing.assert_close(torch.tensor(results[r]["out"]), out, rtol=1e-5, atol=1e-6)
    grad = torch.cat([torch.tensor(results[0]["grad"]), torch.tensor(results[1]["grad"])], -1)
    torch.testing.assert_close(grad, x.grad, rtol=1e-5, atol=1e-6)
