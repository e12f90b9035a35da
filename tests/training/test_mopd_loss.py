"""MOPD hooks: clipped teacher advantage, stopped gradient, reward blindness, metrics."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest
import torch

from dressage.training.log_probs import response_log_probs
from dressage.training.mopd_loss import compute_mopd_advantages, mopd_policy_loss
from dressage.training.mopd_metrics import pop_rollout_metrics
from dressage.training.reducer import get_sum_of_sample_mean

pytestmark = pytest.mark.unit


def test_advantage_is_the_clipped_teacher_gap_and_carries_no_gradient() -> None:
    teacher = torch.tensor([-8.0, -3.0, -1.0, -0.5, 0.0], requires_grad=True)
    old = torch.tensor([-1.0, -1.0, -1.0, -3.5, -9.0], requires_grad=True)
    data: dict[str, Any] = {"teacher_log_probs": [teacher], "log_probs": [old]}
    compute_mopd_advantages(Namespace(), data)
    (adv,) = data["advantages"]
    assert adv.tolist() == [-5.0, -2.0, 0.0, 3.0, 5.0]  # default c = 5
    assert not adv.requires_grad
    assert torch.equal(data["returns"][0], adv) and data["returns"][0] is not adv

    compute_mopd_advantages(Namespace(mopd_advantage_clip=1.0), data)
    assert data["advantages"][0].tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]


def test_rollout_log_probs_are_the_old_policy_with_use_rollout_logprobs() -> None:
    data: dict[str, Any] = {
        "teacher_log_probs": [torch.tensor([-1.0])],
        "log_probs": [torch.tensor([-4.0])],
        "rollout_log_probs": [torch.tensor([-2.0])],
    }
    compute_mopd_advantages(Namespace(use_rollout_logprobs=True), data)
    assert data["advantages"][0].tolist() == [1.0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (Namespace(use_opd=True, opd_kl_coef=1.0), "--use-opd"),
        (Namespace(normalize_advantages=True), "--normalize-advantages"),
        (Namespace(mopd_advantage_clip=0.0), "must be > 0"),
    ],
)
def test_options_that_would_change_the_objective_are_refused(args: Namespace, match: str) -> None:
    data = {"teacher_log_probs": [torch.zeros(1)], "log_probs": [torch.zeros(1)]}
    with pytest.raises(ValueError, match=match):
        compute_mopd_advantages(args, data)


def test_missing_teacher_log_probs_are_named() -> None:
    with pytest.raises(KeyError, match="teacher_log_probs"):
        compute_mopd_advantages(Namespace(), {"log_probs": [torch.zeros(2)]})


def _case(rewards: list[float]) -> tuple[dict[str, Any], dict[str, Any], torch.Tensor]:
    """Two samples (siblings of rollout 3), packed logits [1, 9, 12], teacher and old log-probs."""
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, 12, (5,), generator=gen), torch.randint(0, 12, (4,), generator=gen)]
    logits = torch.randn(1, 9, 12, generator=gen, requires_grad=True)
    batch: dict[str, Any] = {
        "unconcat_tokens": tokens,
        "total_lengths": [5, 4],
        "response_lengths": [3, 2],
        "loss_masks": [torch.tensor([1, 0, 1]), torch.tensor([1, 1])],
        "rollout_mask_sums": torch.tensor([4.0, 4.0]),
    }
    old, _ = response_log_probs(Namespace(), batch, logits.detach())
    teacher = [torch.tensor([-9.0, -1.0, -2.5]), torch.tensor([-0.1, -3.0])]
    rollout_data = {
        "log_probs": old,
        "teacher_log_probs": teacher,
        "loss_masks": batch["loss_masks"],
        "rollout_ids": [3, 3],
        "rollout_mask_sums": batch["rollout_mask_sums"],
        "prompt": ["math", "math"],
        "rewards": rewards,
        "raw_reward": rewards,
    }
    compute_mopd_advantages(Namespace(), rollout_data)
    batch.update(advantages=rollout_data["advantages"], log_probs=old, teacher_log_probs=teacher)
    return batch, rollout_data, logits


def _loss_grad(batch: dict[str, Any], logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    reducer = get_sum_of_sample_mean(
        batch["total_lengths"],
        batch["response_lengths"],
        batch["loss_masks"],
        batch["rollout_mask_sums"],
    )
    loss, metrics = mopd_policy_loss(Namespace(), batch, logits, reducer)
    (grad,) = torch.autograd.grad(loss, logits)
    return grad, metrics


def test_gradient_is_minus_advantage_over_denominator_times_the_softmax_derivative() -> None:
    batch, _, logits = _case([0.0, 1.0])
    grad, _ = _loss_grad(batch, logits)
    expected = torch.zeros_like(logits)
    probs = torch.softmax(logits.detach()[0], -1)
    packed = torch.cat(batch["unconcat_tokens"])
    adv = torch.cat(batch["advantages"])
    mask = torch.cat(batch["loss_masks"]).float()
    for k, row in enumerate([1, 2, 3, 6, 7]):  # the rows predicting the 5 response tokens
        onehot = torch.nn.functional.one_hot(packed[row + 1], 12).float()
        expected[0, row] = -adv[k] * mask[k] / 4.0 * (onehot - probs[row])
    assert torch.allclose(grad, expected, atol=1e-6)


def test_environment_reward_changes_no_advantage_and_no_gradient() -> None:
    batch_a, data_a, logits = _case([0.0, 1.0])
    batch_b, data_b, _ = _case([0.0, -7.0])
    for a, b in zip(data_a["advantages"], data_b["advantages"], strict=True):
        assert torch.equal(a, b)
    grad_a, _ = _loss_grad(batch_a, logits)
    grad_b, _ = _loss_grad(batch_b, logits)
    assert torch.equal(grad_a, grad_b)
    assert data_a["mopd/raw_reward_trainable_trajectory_mean/math"].item() == 1.0
    assert data_b["mopd/raw_reward_trainable_trajectory_mean/math"].item() == -7.0


def test_loss_metrics_are_reduced_like_the_loss() -> None:
    batch, _, logits = _case([0.0, 1.0])
    _, metrics = _loss_grad(batch, logits)
    current = torch.cat(batch["log_probs"])  # no update yet: current == old
    teacher = torch.cat(batch["teacher_log_probs"])
    mask = torch.cat(batch["loss_masks"]).float()

    def reduce(x: torch.Tensor) -> float:
        return float((x * mask).sum() / 4.0)

    assert metrics["mopd_reverse_kl"].item() == pytest.approx(reduce(current - teacher), abs=1e-5)
    gap = (teacher - current).abs()
    assert metrics["mopd_advantage_clipfrac"].item() == pytest.approx(reduce((gap > 5).float()))
    assert metrics["mopd_update_kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert metrics["mopd_loss"].item() == pytest.approx(
        reduce(-torch.cat(batch["advantages"]) * current), abs=1e-5
    )


def test_per_teacher_rollout_metrics() -> None:
    # rollout 0 (math): sibling + anchor (raw 0.0 then 1.0); rollout 1 (code): raw 0.5;
    # rollout 2 (math): nothing trainable (aborted), raw 0.7 must not count.
    data: dict[str, Any] = {
        "log_probs": [
            torch.tensor([-1.0, -2.0]),
            torch.tensor([-1.0]),
            torch.tensor([-3.0]),
            torch.tensor([-1.0]),
        ],
        "teacher_log_probs": [
            torch.tensor([-2.0, -2.0]),
            torch.tensor([-4.0]),
            torch.tensor([-1.0]),
            torch.tensor([-9.0]),
        ],
        "loss_masks": [
            torch.tensor([1, 1]),
            torch.tensor([1]),
            torch.tensor([1]),
            torch.tensor([0]),
        ],
        "rollout_ids": [0, 0, 1, 2],
        "rollout_mask_sums": torch.tensor([3.0, 3.0, 1.0, 0.0]),
        "prompt": ["math", "math", "code", "math"],
        "raw_reward": [0.0, 1.0, 0.5, 0.7],
    }
    compute_mopd_advantages(Namespace(), data)
    metrics = pop_rollout_metrics(data)
    assert not any(k.startswith("mopd/") for k in data)
    prefix = "rollout/mopd/"
    assert metrics[prefix + "raw_reward_trainable_trajectory_mean/math"] == pytest.approx(1.0)
    assert metrics[prefix + "raw_reward_trainable_trajectory_mean/code"] == pytest.approx(0.5)
    # math: tokens (1, 0, 3) of rollout 0, weights 1/3 each -> mean 4/3; rollout 2 has none
    assert metrics[prefix + "opd_reverse_kl_train_aggregation_mean/math"] == pytest.approx(4 / 3)
    assert metrics[prefix + "opd_reverse_kl_train_aggregation_mean/code"] == pytest.approx(-2.0)


def _two_teacher_batch() -> dict[str, Any]:
    return {
        "log_probs": [torch.tensor([-1.0, -2.0]), torch.tensor([-1.0]), torch.tensor([-3.0])],
        "teacher_log_probs": [
            torch.tensor([-2.0, -2.0]),
            torch.tensor([-4.0]),
            torch.tensor([-1.0]),
        ],
        "loss_masks": [torch.tensor([1, 1]), torch.tensor([1]), torch.tensor([1])],
        "rollout_ids": [0, 0, 1],
        "rollout_mask_sums": torch.tensor([3.0, 3.0, 1.0]),
        "prompt": ["math", "math", "code"],
        "raw_reward": [0.0, 1.0, 0.5],
    }


def _rows(data: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    return {
        k: (v[rows] if isinstance(v, torch.Tensor) else [v[i] for i in rows])
        for k, v in data.items()
    }


def test_under_slime_teacher_metrics_are_deferred_and_combine_exactly_over_ranks(
    tmp_path: Any,
) -> None:
    from dressage.training.mopd_actor import log_teacher_metrics
    from dressage.training.mopd_metrics import deferred_sums

    whole = _two_teacher_batch()
    compute_mopd_advantages(Namespace(), whole)
    expected = pop_rollout_metrics(whole)
    deferred_sums()  # start clean
    args = Namespace(mopd_defer_rollout_metrics=True, mopd_metrics_dir=str(tmp_path))
    shards = []
    for rows in ([0, 1], [2]):  # two data-parallel ranks; siblings of rollout 0 stay together
        data = _rows(_two_teacher_batch(), rows)
        compute_mopd_advantages(args, data)
        assert not any(k.startswith("mopd/") for k in data)  # slime's logging never sees them
        assert len(data["advantages"]) == len(rows)
        shards.append(deferred_sums())
    from dressage.training.mopd_actor import combine_sums
    from dressage.training.mopd_metrics import means_of

    combined = {f"rollout/{k}": v for k, v in means_of(combine_sums(shards)).items()}
    assert combined == pytest.approx(expected)
    compute_mopd_advantages(args, _two_teacher_batch())  # one process: the whole batch
    logged = log_teacher_metrics(args, 7)
    assert logged == pytest.approx(expected)
    line = (tmp_path / "teachers.jsonl").read_text().splitlines()[-1]
    assert '"step": 7' in line and "opd_reverse_kl_train_aggregation_mean/math" in line


def test_raw_reward_shipped_whole_is_localised_through_the_partition() -> None:
    data: dict[str, Any] = {
        "log_probs": [torch.tensor([-1.0])],
        "teacher_log_probs": [torch.tensor([-1.0])],
        "loss_masks": [torch.tensor([1])],
        "rollout_ids": [5],
        "prompt": ["code"],
        "raw_reward": [0.1, 0.2, 0.9],  # all DP ranks
        "partition": [2],  # this rank holds global sample 2
    }
    compute_mopd_advantages(Namespace(), data)
    assert data["mopd/raw_reward_trainable_trajectory_mean/code"].item() == pytest.approx(0.9)
