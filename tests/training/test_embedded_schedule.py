"""The embedded trainer's pure parts: step schedule, train_data checks, estimators, hooks."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest
import torch

from dressage.training.embedded.advantages import compute_advantages_and_returns
from dressage.training.embedded.data import check_train_data, select
from dressage.training.embedded.schedule import build_schedule
from tests.training.train_data_factory import train_data

pytestmark = pytest.mark.unit


def test_steps_take_whole_rollouts_and_drop_the_trailing_ones() -> None:
    # rollout 5 has siblings at positions 0 and 3; rollouts in first-seen order: 5, 2, 9, 4, 1
    rollout_ids = [5, 2, 9, 5, 4, 1, 9]
    schedule = build_schedule(rollout_ids, [4] * 7, global_batch_size=2, micro_batch_size=1)
    assert len(schedule.steps) == 2
    assert schedule.order == [0, 3, 1, 2, 6, 4]  # rollouts 5, 2 | 9, 4
    assert schedule.dropped == [5]  # rollout 1 fills no step
    step_rollouts = [{rollout_ids[schedule.order[i]] for i in s.positions} for s in schedule.steps]
    assert step_rollouts == [{5, 2}, {9, 4}]
    assert all(s.num_rollouts == 2 for s in schedule.steps)


def test_static_and_dynamic_micro_batches() -> None:
    lengths = [5, 3, 8, 2]
    static = build_schedule([0, 1, 2, 3], lengths, global_batch_size=4, micro_batch_size=3)
    assert static.steps[0].micro_batches == [[0, 1, 2], [3]]
    dynamic = build_schedule([0, 1, 2, 3], lengths, global_batch_size=4, max_tokens_per_gpu=10)
    # first fit: 5 -> bin 0, 3 -> bin 0 (8), 8 -> bin 1, 2 -> bin 0 (10)
    assert dynamic.steps[0].micro_batches == [[0, 1, 3], [2]]


def test_too_few_rollouts_for_one_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 rollouts, fewer than global_batch_size 4"):
        build_schedule([0, 1, 2], [3, 3, 3], global_batch_size=4)


def test_select_tensorises_like_slime_and_keeps_the_schedule_order() -> None:
    data = train_data([(3, 2), (2, 1), (4, 3)], rewards=[1.0, 2.0, 3.0])
    local = select(data, [2, 0], torch.device("cpu"))
    assert local["rewards"] == [3.0, 1.0] and local["raw_reward"] == [3.0, 1.0]
    assert local["tokens"][0].dtype == torch.long and local["total_lengths"] == [7, 5]
    assert local["loss_masks"][0].dtype == torch.int32
    assert local["rollout_log_probs"][1].dtype == torch.float32
    assert local["rollout_mask_sums"].tolist() == [3.0, 2.0]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda d: d.pop("rollout_ids"), KeyError, "lacks \\['rollout_ids'\\]"),
        (lambda d: d["loss_masks"].__setitem__(1, [1]), ValueError, "sample 1 .*loss_masks has 1"),
        (lambda d: d["response_lengths"].__setitem__(0, 5), ValueError, "sample 0 .*must be in"),
        (lambda d: d["rewards"].pop(), ValueError, "'rewards'\\] has 2 entries for 3"),
        (lambda d: d.pop("prompt"), KeyError, "no 'prompt' key"),
        (
            lambda d: d["prompt"].__setitem__(2, "physics"),
            ValueError,
            "sample 2 \\(index 2, dataset 'tiny-set'\\): teacher_id 'physics' is not a loaded",
        ),
        (
            lambda d: d["prompt"].__setitem__(1, "code"),
            ValueError,
            "rollout 7: siblings disagree on the teacher: sample 0 .* 'math', sample 1 .* 'code'",
        ),
    ],
)
def test_bad_train_data_fails_naming_key_sample_dataset_and_teacher(
    change: Any, error: type[Exception], match: str
) -> None:
    data = train_data(
        [(3, 2), (2, 2), (4, 3)], rollout_ids=[7, 7, 8], teacher_ids=["math", "math", "code"]
    )
    check_train_data(data, teachers={"math", "code"})
    change(data)
    with pytest.raises(error, match=match):
        check_train_data(data, teachers={"math", "code"})


def _rollout_data(rewards: list[float]) -> dict[str, Any]:
    return {
        "log_probs": [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.0, -1.0])],
        "loss_masks": [torch.tensor([1, 1, 0]), torch.tensor([1, 1])],
        "rewards": rewards,
    }


def test_grpo_family_broadcasts_the_reward() -> None:
    data = _rollout_data([0.5, -1.0])
    compute_advantages_and_returns(Namespace(advantage_estimator="gspo"), data)
    assert [a.tolist() for a in data["advantages"]] == [[0.5] * 3, [-1.0] * 2]
    assert all(torch.equal(a, r) for a, r in zip(data["advantages"], data["returns"], strict=True))
    assert all(not k.any() for k in data["kl"])


def test_reinforce_plus_plus_discounts_from_the_last_trainable_token() -> None:
    data = _rollout_data([1.0, 2.0])
    args = Namespace(
        advantage_estimator="reinforce_plus_plus", gamma=0.5, normalize_advantages=False
    )
    with pytest.raises(ValueError, match="requires --normalize-advantages"):
        compute_advantages_and_returns(args, data)
    args.normalize_advantages = True
    compute_advantages_and_returns(args, data)
    assert [r.tolist() for r in data["returns"]] == [[0.5, 1.0, 0.0], [1.0, 2.0]]
    adv = torch.cat(data["advantages"])[torch.tensor([0, 1, 3, 4])]
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)  # whitened over masked tokens
    assert adv.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-3)  # slime: Bessel


def test_baseline_estimator_subtracts_reward_kl_and_opd_shapes_after_the_estimator() -> None:
    data = _rollout_data([1.0, 1.0])
    data["ref_log_probs"] = [torch.tensor([-1.5, -2.0, -3.0]), torch.tensor([-1.0, -0.5])]
    data["teacher_log_probs"] = [torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-2.0, -1.0])]
    args = Namespace(
        advantage_estimator="reinforce_plus_plus_baseline",
        kl_coef=0.1,
        kl_loss_type="k1",
        use_opd=True,
        opd_kl_coef=2.0,
        normalize_advantages=True,  # slime requires it for the REINFORCE++ estimators
    )
    compute_advantages_and_returns(args, data)
    # before whitening (slime's rppb returns are that list): 1 - 0.1 (logp - ref) - 2 (logp - T)
    assert data["returns"][0].tolist() == pytest.approx([1 - 0.05, 1 + 2.0, 1 + 4.0])
    assert data["returns"][1].tolist() == pytest.approx([1 - 2.0, 1 + 0.05])
    mask = torch.cat(data["loss_masks"]).bool()
    assert torch.cat(data["advantages"])[mask].mean().item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="normalize-advantages"):
        compute_advantages_and_returns(
            Namespace(advantage_estimator="reinforce_plus_plus_baseline"), _rollout_data([1, 1])
        )


def test_a_custom_advantage_hook_replaces_the_estimator() -> None:
    data = _rollout_data([9.0, 9.0])
    data["teacher_log_probs"] = [torch.zeros(3), torch.zeros(2)]
    args = Namespace(
        advantage_estimator="mopd",
        custom_advantage_function_path="dressage.training.mopd_loss.compute_mopd_advantages",
    )
    compute_advantages_and_returns(args, data)
    assert data["advantages"][0].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(NotImplementedError, match="needs a critic"):
        compute_advantages_and_returns(Namespace(advantage_estimator="ppo"), _rollout_data([0, 0]))
