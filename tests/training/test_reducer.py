"""slime's sum_of_sample_mean: exact values against a hand computation."""

from __future__ import annotations

import pytest
import torch

from dressage.training.reducer import get_sum_of_sample_mean

pytestmark = pytest.mark.unit


def _masks(*rows: list[int]) -> list[torch.Tensor]:
    return [torch.tensor(r) for r in rows]


def test_denominators_divide_each_sample_masked_sum() -> None:
    masks = _masks([1, 1, 0], [1, 0])
    x = torch.tensor([1.0, 2.0, 100.0, 4.0, 100.0])  # masked entries must not count
    reduce = get_sum_of_sample_mean([5, 4], [3, 2], masks, torch.tensor([6.0, 8.0]))
    # (1 + 2) / 6 + 4 / 8
    assert reduce(x).item() == pytest.approx(0.5 + 0.5)


def test_without_denominators_each_sample_is_its_own_token_mean() -> None:
    masks = _masks([1, 1, 0], [0, 1])
    x = torch.tensor([1.0, 3.0, 9.0, 9.0, 5.0])
    reduce = get_sum_of_sample_mean([4, 3], [3, 2], masks)
    assert reduce(x).item() == pytest.approx(2.0 + 5.0)


def test_denominator_is_clamped_at_one_and_empty_masks_contribute_nothing() -> None:
    masks = _masks([1], [0, 0])
    reduce = get_sum_of_sample_mean([2, 3], [1, 2], masks, torch.tensor([0.25, 0.0]))
    assert reduce(torch.tensor([3.0, 7.0, 7.0])).item() == pytest.approx(3.0)


def test_per_token_mode_is_a_masked_sum() -> None:
    masks = _masks([1, 0, 1], [1])
    reduce = get_sum_of_sample_mean(
        [4, 2], [3, 1], masks, torch.tensor([10.0, 10.0]), calculate_per_token_loss=True
    )
    assert reduce(torch.tensor([1.0, 50.0, 2.0, 4.0])).item() == pytest.approx(7.0)


def test_siblings_split_across_micro_batches_add_up_to_one_rollout_token_mean() -> None:
    # Rollout 7: two siblings with 3 + 2 trainable tokens; rollout 9: one sample with 2 tokens.
    x_a, mask_a = torch.tensor([1.0, 2.0, 3.0, 8.0]), [1, 1, 1, 0]
    x_b, mask_b = torch.tensor([4.0, 5.0]), [1, 1]
    x_c, mask_c = torch.tensor([10.0, 20.0]), [1, 1]
    denoms = {"a": 5.0, "b": 5.0, "c": 2.0}  # rollout_mask_sums: the rollout's summed mask
    # micro-batch 1 holds sibling a and sample c; micro-batch 2 holds sibling b.
    mb1 = get_sum_of_sample_mean(
        [6, 4], [4, 2], _masks(mask_a, mask_c), torch.tensor([denoms["a"], denoms["c"]])
    )(torch.cat([x_a, x_c]))
    mb2 = get_sum_of_sample_mean([3], [2], _masks(mask_b), torch.tensor([denoms["b"]]))(x_b)
    rollout_7 = (1 + 2 + 3 + 4 + 5) / 5
    rollout_9 = (10 + 20) / 2
    assert (mb1 + mb2).item() == pytest.approx(rollout_7 + rollout_9)


def test_reducer_is_differentiable_with_weights_mask_over_denominator() -> None:
    masks = _masks([1, 0], [1])
    x = torch.tensor([2.0, 3.0, 4.0], requires_grad=True)
    get_sum_of_sample_mean([3, 2], [2, 1], masks, torch.tensor([4.0, 2.0]))(x).backward()
    assert x.grad is not None
    assert x.grad.tolist() == pytest.approx([0.25, 0.0, 0.5])


@pytest.mark.parametrize(
    ("response_lengths", "masks", "denoms", "match"),
    [
        ([2], [[1, 1, 1]], None, "loss mask has 3 entries"),
        ([2, 1], [[1, 1]], None, "reducer inputs disagree"),
        ([2], [[1, 1]], [1.0, 2.0], "rollout_mask_sums has 2 entries"),
    ],
)
def test_inconsistent_inputs_fail_naming_the_problem(
    response_lengths: list[int], masks: list[list[int]], denoms: list[float] | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        get_sum_of_sample_mean(
            [9] * len(response_lengths), response_lengths, _masks(*masks), denoms
        )


def test_wrong_token_count_is_refused() -> None:
    reduce = get_sum_of_sample_mean([4], [2], _masks([1, 1]))
    with pytest.raises(ValueError, match="3 token values for 2"):
        reduce(torch.zeros(3))
