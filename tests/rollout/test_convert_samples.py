"""convert_samples_to_train_data: prompt-equal weights, keys, sibling checks and bad input."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.convert import check_same, plain_convert
from dressage.rollout.convert_samples import convert_samples_to_train_data
from dressage.rollout.multi_segment import mark_aborted_no_grad
from dressage.schemas import train_data_to_table, validate_table
from dressage.types import Sample
from tests.rollout.factories import batch, slime_args, template, trajectory

pytestmark = pytest.mark.unit

PROMPT_EQUAL = ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"]


def reducer_weights(train_data: dict[str, Any], gbs: int) -> list[float]:
    """Each sample's total gradient weight as slime weighs it (reference/slime.md §3.4):
    ``sum_t mask_t / max(denom, 1)`` per sample, the step scaled by ``1 / global_batch_size``."""
    return [
        sum(mask) / max(denom, 1.0) / gbs
        for mask, denom in zip(
            train_data["loss_masks"], train_data["rollout_mask_sums"], strict=True
        )
    ]


def prompt_weights(samples: list[Sample], train_data: dict[str, Any], gbs: int) -> dict:
    out: dict[int, float] = defaultdict(float)
    for sample, weight in zip(samples, reducer_weights(train_data, gbs), strict=True):
        out[sample.group_index] += weight
    return dict(out)


@st.composite
def two_splits(draw: st.DrawFn) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
    """The same trajectories (same trainable tokens each) split into segments two ways."""

    def split(total: int) -> list[int]:
        cuts = sorted(draw(st.lists(st.integers(0, total), max_size=3)))
        bounds = [0, *cuts, total]
        return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]

    first, second = [], []
    for _ in range(draw(st.integers(1, 4))):
        totals = draw(st.lists(st.integers(0, 30), min_size=1, max_size=4))
        first.append([split(t) for t in totals])
        second.append([split(t) for t in totals])
    return first, second


@settings(max_examples=60, deadline=None)
@given(
    splits=two_splits(),
    gbs=st.sampled_from([1, 2, 8, 64, 512]),
    estimator=st.sampled_from(PROMPT_EQUAL),
)
def test_prompt_weight_does_not_depend_on_how_trajectories_split(
    splits: tuple[list[list[list[int]]], list[list[list[int]]]], gbs: int, estimator: str
) -> None:
    args = slime_args(global_batch_size=gbs, advantage_estimator=estimator)
    first, second = splits
    samples_a, samples_b = batch(args, first), batch(args, second)
    weights_a = prompt_weights(samples_a, convert_samples_to_train_data(args, samples_a), gbs)
    weights_b = prompt_weights(samples_b, convert_samples_to_train_data(args, samples_b), gbs)
    prompts, rollouts = len(first), sum(len(t) for t in first)
    for p, trajectories in enumerate(first):
        m_p = sum(map(sum, trajectories))
        assert weights_a[p] == pytest.approx(weights_b[p], rel=1e-12, abs=1e-15)
        # d = M_P x prompts / rollouts: each prompt weighs rollouts / (gbs x prompts), i.e.
        # 1 / N_P when the batch is one step, unless slime's clamp max(d, 1) bites
        denom = m_p * prompts / rollouts
        expected = rollouts / (gbs * prompts) if denom >= 1 else m_p / gbs
        assert weights_a[p] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(
    splits=two_splits(),
    estimator=st.sampled_from([*PROMPT_EQUAL, "ppo", "reinforce_plus_plus"]),
    seed=st.integers(0, 2**16),
)
def test_matches_the_plain_per_sample_implementation(
    splits: tuple[list[list[list[int]]], list[list[list[int]]]], estimator: str, seed: int
) -> None:
    rng = random.Random(seed)
    args = slime_args(advantage_estimator=estimator, global_batch_size=rng.choice([1, 4, 16]))
    samples = batch(args, splits[0], None)
    for sample in samples:
        sample.remove_sample = rng.random() < 0.2
    rng.shuffle(samples)
    ours = convert_samples_to_train_data(args, samples)
    check_same(ours, plain_convert(args, samples))


def test_anchor_value_is_broadcast_and_raw_stays_sparse() -> None:
    args = slime_args(advantage_estimator="ppo")
    samples = batch(args, [[[2, 3, 1], [4]]], [[0.25, 1.0]])
    data = convert_samples_to_train_data(args, samples)
    assert data["rewards"] == [0.25, 0.25, 0.25, 1.0]
    assert data["raw_reward"] == [0.0, 0.0, 0.25, 1.0]
    assert data["rollout_ids"] == [0, 0, 0, 1]


def test_keys_types_and_schema() -> None:
    args = slime_args()
    samples = batch(args, [[[3, 1], [2]], [[1], [1, 1, 1]]])
    data = convert_samples_to_train_data(args, samples)
    assert list(data) == [
        "tokens",
        "response_lengths",
        "rewards",
        "raw_reward",
        "truncated",
        "sample_indices",
        "rollout_ids",
        "loss_masks",
        "rollout_mask_sums",
        "rollout_log_probs",
        "source_names",
    ]
    assert all(len(v) == len(samples) for v in data.values())
    assert all(type(x) is int for x in data["response_lengths"] + data["truncated"])
    assert all(type(x) is float for x in data["rewards"] + data["rollout_mask_sums"])
    assert data["tokens"][0] is samples[0].tokens  # passed by reference, never copied
    assert data["source_names"] == ["unknown"] * len(samples)
    assert validate_table("train_data", train_data_to_table(data)).ok


def test_other_estimators_get_slimes_rollout_sums() -> None:
    for estimator in ("ppo", "reinforce_plus_plus", "mopd"):
        args = slime_args(advantage_estimator=estimator, rewards_normalization=False)
        data = convert_samples_to_train_data(args, batch(args, [[[3, 1], [2]]]))
        assert data["rollout_mask_sums"] == [4.0, 4.0, 2.0], estimator


def test_teacher_ids_fill_the_prompt_slot() -> None:
    args = slime_args()
    samples = batch(args, [[[1, 2], [3]]], teacher_id="math-teacher")
    data = convert_samples_to_train_data(args, samples)
    assert data["prompt"] == ["math-teacher"] * 3
    assert validate_table("train_data", train_data_to_table(data)).ok
    samples[2].metadata.pop("teacher_id")
    with pytest.raises(ValueError, match="sample index=1 .*field=metadata.teacher_id: missing"):
        convert_samples_to_train_data(args, samples)


@pytest.mark.parametrize("field", ["teacher_id", "instance_id"])
def test_siblings_that_disagree_fail_before_training(field: str) -> None:
    args = slime_args()
    samples = batch(args, [[[1, 2, 3]]], teacher_id="t-a")
    samples[1].metadata[field] = "other"
    with pytest.raises(ValueError, match=f"sample index=0 session=sess-0#1 field=metadata.{field}"):
        convert_samples_to_train_data(args, samples)


def test_segment_samples_must_name_their_session() -> None:
    args = slime_args()
    samples = batch(args, [[[1, 2]]])
    samples[1].metadata.pop("parent_traj_id")
    with pytest.raises(ValueError, match="sample index=0 .*field=metadata.parent_traj_id"):
        convert_samples_to_train_data(args, samples)


def test_removed_and_failed_trajectories_count_but_train_nothing() -> None:
    args = slime_args(global_batch_size=1)
    samples = batch(args, [[[2, 2], [4], [8]]])
    samples[2].remove_sample = True  # filtered by a rollout-sample filter
    failed = mark_aborted_no_grad(samples[3], reason="timeout")
    data = convert_samples_to_train_data(args, samples)
    assert data["loss_masks"][2] == [0] * samples[2].response_length
    assert sum(data["loss_masks"][3]) == 0 and failed.remove_sample
    # M_P = 2 + 2 trainable tokens over 3 trajectories of one prompt (the failed one counts)
    assert data["rollout_mask_sums"] == pytest.approx([4 / 3] * 4)
    assert validate_table("train_data", train_data_to_table(data)).ok


def test_missing_mask_becomes_ones_and_none_rollout_ids_get_fresh_ones() -> None:
    args = slime_args(advantage_estimator="ppo")
    plain = [
        Sample(index=10, tokens=[1, 2, 3], response_length=2, reward=1.0),
        Sample(index=11, tokens=[1, 2], response_length=1, reward=0.0),
    ]
    for s in plain:
        s.rollout_log_probs = [-0.1] * s.response_length
    samples = [*trajectory(args, template(0, 0), [1, 1], reward=1.0), *plain]
    data = convert_samples_to_train_data(args, samples)
    assert data["rollout_ids"] == [0, 0, 1, 2]  # 0 is taken: the plain samples get 1 and 2
    assert plain[0].loss_mask == [1, 1] and data["loss_masks"][2] == [1, 1]


def test_per_token_keys_follow_the_first_sample() -> None:
    args = slime_args(advantage_estimator="ppo")
    samples = trajectory(args, template(0, 0), [1, 1], reward=1.0)
    bare = Sample(index=10, tokens=[1, 2, 3], response_length=2, reward=1.0)
    assert "rollout_log_probs" not in convert_samples_to_train_data(args, [bare, *samples])
    with pytest.raises(ValueError, match="sample index=10 .*field=rollout_log_probs: missing"):
        convert_samples_to_train_data(args, [*samples, bare])
    bare.loss_mask = [0, 0]  # a sample that trains nothing may lack them: zeros stand in
    data = convert_samples_to_train_data(args, [*samples, bare])
    assert data["rollout_log_probs"][-1] == [0.0, 0.0]


def test_optional_keys_follow_the_first_sample() -> None:
    args = slime_args(rollout_top_p=0.9)
    samples = batch(args, [[[1], [2]]])
    for s in samples:
        n = s.response_length
        s.metadata.update(round_number=3, raw_reward=7.0, source_name="calc")
        s.train_metadata = {"k": 1}
        s.rollout_routed_experts = [[0]]
        s.teacher_log_probs = [-0.5] * n
        s.rollout_top_p_token_ids = [1] * n
        s.rollout_top_p_token_offsets = list(range(n + 1))
    samples[1].multimodal_train_inputs = {"pixel_values": [0]}
    data = convert_samples_to_train_data(args, samples)
    assert data["round_number"] == [3, 3]
    assert data["raw_reward"] == [7.0, 7.0]
    assert data["metadata"] == [{"k": 1}] * 2
    assert data["multimodal_train_inputs"] == [None, {"pixel_values": [0]}]
    assert data["teacher_log_probs"][0] == [-0.5] * samples[0].response_length
    assert data["source_names"] == ["calc", "calc"]
    assert data["rollout_top_p_token_offsets"][1] == list(range(samples[1].response_length + 1))
    samples[1].rollout_top_p_token_offsets = [1, 2]
    with pytest.raises(ValueError, match="sample index=1 .*field=rollout_top_p_token_offsets"):
        convert_samples_to_train_data(args, samples)


def _bad(samples: list[Sample], how: str) -> None:
    s = samples[1]
    if how == "mask_length":
        s.loss_mask = [*(s.loss_mask or []), 1]
    elif how == "logprob_length":
        s.rollout_log_probs = (s.rollout_log_probs or [])[:-1]
    elif how == "response_length":
        s.response_length = len(s.tokens) + 1
    elif how == "nan_unrecorded":
        s.metadata.pop("dressage_written")
        s.rollout_log_probs[0] = math.nan
    elif how == "stale_record":
        s.loss_mask = [1] * s.response_length  # edited without record_written
    elif how == "teacher_nan":
        for t in samples:
            t.teacher_log_probs = [0.0] * t.response_length
        s.teacher_log_probs[0] = math.nan


@pytest.mark.parametrize(
    ("how", "field"),
    [
        ("mask_length", "loss_mask"),
        ("logprob_length", "rollout_log_probs"),
        ("response_length", "response_length"),
        ("nan_unrecorded", "rollout_log_probs"),
        ("stale_record", "metadata.dressage_written"),
        ("teacher_nan", "teacher_log_probs"),
    ],
)
def test_bad_input_names_the_sample_and_the_field(how: str, field: str) -> None:
    args = slime_args()
    samples = batch(args, [[[2], [3]]])
    _bad(samples, how)
    with pytest.raises(ValueError, match=f"sample index=1 session=sess-1#0 field={field}"):
        convert_samples_to_train_data(args, samples)


def test_wrong_reward_type_and_missing_prompt_fail() -> None:
    args = slime_args()
    samples = batch(args, [[[2], [3]]])
    samples[0].reward = "good"
    with pytest.raises(TypeError, match="sample index=0 session=sess-0#0 field=reward"):
        convert_samples_to_train_data(args, samples)
    samples[0].reward = 1.0
    for s in samples:
        s.group_index = None
        s.metadata.pop("instance_id")
    with pytest.raises(ValueError, match="sample index=0 .*field=group_index: .*names no prompt"):
        convert_samples_to_train_data(args, samples)


# -- slime's DP schedule (reference/slime.md §5): siblings never straddle a step --------------


def dp_steps(rollout_ids: list[int], global_batch_size: int) -> list[list[int]]:
    """Sample positions per optimizer step, grouped as slime's build_dp_schedule groups them:
    rollouts in first-occurrence order, ``global_batch_size`` rollouts (with all their samples)
    per step, trailing rollouts that do not fill a step dropped."""
    members: dict[int, list[int]] = {}
    for position, rollout_id in enumerate(rollout_ids):
        members.setdefault(rollout_id, []).append(position)
    rollouts = list(members.values())
    steps = len(rollouts) // global_batch_size
    return [
        [
            p
            for group in rollouts[k * global_batch_size : (k + 1) * global_batch_size]
            for p in group
        ]
        for k in range(steps)
    ]


@settings(max_examples=40, deadline=None)
@given(
    splits=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=12),
    plain=st.integers(0, 3),
    gbs=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_grouping_by_rollout_id_keeps_siblings_in_one_step(
    splits: list[list[int]], plain: int, gbs: int, seed: int
) -> None:
    args = slime_args(global_batch_size=gbs, advantage_estimator="ppo")
    samples = []
    for t, split in enumerate(splits):
        samples += trajectory(args, template(t, t), split, reward=1.0)
    for k in range(plain):  # plain slime samples without rollout ids: one rollout each
        sample = Sample(index=100 + k, tokens=[1, 2], response_length=1, reward=0.0)
        sample.rollout_log_probs = [-0.5]
        samples.append(sample)
    random.Random(seed).shuffle(samples)
    data = convert_samples_to_train_data(args, samples)
    assert len(set(data["rollout_ids"])) == len(splits) + plain
    steps = dp_steps(data["rollout_ids"], gbs)
    step_of = {p: k for k, step in enumerate(steps) for p in step}
    by_trajectory: dict[Any, set] = defaultdict(set)
    for position, sample in enumerate(samples):
        key = sample.metadata.get("parent_traj_id") or f"plain-{sample.index}"
        by_trajectory[key].add(step_of.get(position))  # None: dropped with its whole rollout
    assert all(len(found) == 1 for found in by_trajectory.values())
    for step in steps:
        assert len({data["rollout_ids"][p] for p in step}) == gbs
