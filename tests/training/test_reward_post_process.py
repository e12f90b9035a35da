"""reward_post_process: anchors-only group statistics by group_index, broadcast, sparse raw."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.rollout.multi_segment import mark_aborted_no_grad
from dressage.training.reward_post_process import reward_post_process
from dressage.types import Sample
from tests.rollout.factories import batch, slime_args, template

pytestmark = pytest.mark.unit

ESTIMATORS = ["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]


def _reference(values: list[float], estimator: str, normalize: bool, std: bool) -> list[float]:
    """slime's per-group arithmetic on one prompt's anchors, with torch (float64)."""
    t = torch.tensor(values, dtype=torch.float64)
    if not normalize or estimator not in {"grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"}:
        return t.tolist()
    out = t - t.mean()
    if std and estimator != "reinforce_plus_plus_baseline":
        spread = t.std() if t.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        out = out / (spread + 1e-6)
    return out.tolist()


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[list[list[int]]], list[list[float]]]:
    n_prompts = draw(st.integers(1, 4))
    prompts, rewards = [], []
    for _ in range(n_prompts):
        n_traj = draw(st.integers(1, 4))
        prompts.append(
            [draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)) for _ in range(n_traj)]
        )
        rewards.append([draw(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5])) for _ in range(n_traj)])
    return prompts, rewards


@settings(max_examples=60, deadline=None)
@given(
    layout=batches(),
    estimator=st.sampled_from(ESTIMATORS),
    normalize=st.booleans(),
    std=st.booleans(),
    n=st.sampled_from([1, 4]),
    seed=st.integers(0, 2**16),
)
def test_anchor_statistics_broadcast_and_sparse_raw(
    layout: tuple[list[list[list[int]]], list[list[float]]],
    estimator: str,
    normalize: bool,
    std: bool,
    n: int,
    seed: int,
) -> None:
    prompts, rewards = layout
    args = slime_args(
        advantage_estimator=estimator,
        rewards_normalization=normalize,
        grpo_std_normalization=std,
        n_samples_per_prompt=n,
    )
    samples = batch(args, prompts, rewards)
    random.Random(seed).shuffle(samples)  # grouping is by group_index, never by position
    raw, post = reward_post_process(args, samples)

    expected: dict[int, float] = {}
    for p, values in enumerate(rewards):
        ref = _reference(values, estimator, normalize, std and n != 1)
        for r, value in enumerate(ref):
            expected[_index(p, r, prompts)] = value
    for sample, raw_value, value in zip(samples, raw, post, strict=True):
        anchor = sample.metadata["segment_index"] == sample.metadata["num_segments"] - 1
        p = sample.group_index
        r = sample.index - _index(p, 0, prompts)
        assert raw_value == (rewards[p][r] if anchor else 0.0)
        assert value == pytest.approx(expected[sample.index], rel=1e-9, abs=1e-9)


def _index(p: int, r: int, prompts: list[list[list[int]]]) -> int:
    return sum(len(t) for t in prompts[:p]) + r


def test_removed_anchors_are_left_out_of_the_statistics() -> None:
    args = slime_args()
    samples = batch(args, [[[2], [1, 1], [3]]], [[1.0, 0.0, 0.0]])
    mark_aborted_no_grad(samples[-1], reason="timeout")  # the third trajectory failed
    samples[-1].reward = None  # a removed anchor may be unscored
    raw, post = reward_post_process(args, samples)
    kept = _reference([1.0, 0.0], "grpo", True, True)
    assert post == pytest.approx([kept[0], kept[1], kept[1], 0.0])
    assert raw == [1.0, 0.0, 0.0, 0.0]


def test_siblings_placeholders_never_enter_the_mean() -> None:
    args = slime_args(grpo_std_normalization=False)
    # one trajectory of 4 segments, one of 1: positional or all-sample statistics would differ
    samples = batch(args, [[[1, 1, 1, 1], [1]]], [[1.0, 0.0]])
    _, post = reward_post_process(args, samples)
    assert post == pytest.approx([0.5] * 4 + [-0.5])


def test_single_anchor_group_gets_zero_not_nan() -> None:
    args = slime_args()
    _, post = reward_post_process(args, batch(args, [[[2, 2]]], [[1.0]]))
    assert post == [0.0, 0.0]


def test_reward_key_picks_from_dict_rewards() -> None:
    args = slime_args(reward_key="score", advantage_estimator="ppo")
    samples = batch(args, [[[1, 1]]], [[0.0]])
    samples[-1].reward = {"score": 0.75, "other": 3}
    raw, post = reward_post_process(args, samples)
    assert raw == [0.0, 0.75] and post == [0.75, 0.75]


@pytest.mark.parametrize(
    ("reward", "reward_key", "error", "match"),
    [
        (None, None, TypeError, "no reward"),
        ("1.0", None, TypeError, "expected a number, got str"),
        (float("nan"), None, ValueError, "not finite"),
        (0.5, "score", TypeError, "needs a dict"),
        ({"x": 1.0}, "score", TypeError, "needs a dict reward with that key"),
    ],
)
def test_bad_rewards_name_the_sample_and_field(
    reward: object, reward_key: str | None, error: type[Exception], match: str
) -> None:
    args = slime_args(reward_key=reward_key)
    samples = batch(args, [[[1], [2]]])
    if reward_key:
        samples[0].reward = {reward_key: 1.0}
    samples[1].reward = reward
    with pytest.raises(error, match=f"sample index=1 session=sess-1#0 field=reward: .*{match}"):
        reward_post_process(args, samples)


def test_plain_slime_samples_are_their_own_anchors() -> None:
    args = slime_args(grpo_std_normalization=False)
    samples = [Sample(index=i, group_index=i // 2, reward=float(i)) for i in range(4)]
    raw, post = reward_post_process(args, samples)
    assert raw == [0.0, 1.0, 2.0, 3.0]
    assert post == pytest.approx([-0.5, 0.5, -0.5, 0.5])


def test_missing_prompt_ids_fail_only_when_normalising() -> None:
    samples = [Sample(index=0, reward=1.0), Sample(index=1, reward=0.0)]
    with pytest.raises(ValueError, match="sample index=0 session=None field=group_index"):
        reward_post_process(slime_args(), samples)
    assert reward_post_process(slime_args(rewards_normalization=False), samples)[1] == [1.0, 0.0]


def test_siblings_disagreeing_on_instance_fail() -> None:
    args = slime_args()
    samples = batch(args, [[[1, 1]]])
    samples[0].metadata["instance_id"] = "elsewhere"
    with pytest.raises(ValueError, match="sample index=0 .*field=metadata.instance_id"):
        reward_post_process(args, samples)
    lone = template(9, 0)
    lone.reward = 1.0
    lone.metadata.update(segment_index=0, num_segments=2, parent_traj_id="s")
    with pytest.raises(ValueError, match="sample index=9 .*has 0 anchors"):
        reward_post_process(args, [lone])
