"""convert_samples_to_train_data: prompt-equal weights, keys, sibling checks and bad input."""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.rollout import convert_samples as convert_module
from dressage.rollout.convert_samples import convert_samples_to_train_data
from dressage.rollout.multi_segment import mark_aborted_no_grad
from dressage.schemas import train_data_to_table, validate_table
from dressage.slime.args import add_dressage_arguments
from dressage.slime.args import slime_args as read_args
from dressage.types import Sample
from tests.helpers import REPO
from tests.rollout.factories import batch, slime_args, template, trajectory

pytestmark = pytest.mark.unit

PROMPT_EQUAL = ["grpo", "reinforce_plus_plus_baseline"]  # the default
OPT_IN = ["gspo", "cispo"]  # prompt-equal only when --dressage-prompt-equal-estimators names them
GROUP_ESTIMATORS = {*PROMPT_EQUAL, *OPT_IN}


def reducer_weights(train_data: dict[str, Any], gbs: int) -> list[float]:
    """Each sample's total gradient weight as slime weighs it (docs/slime.md §3.4):
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


# -- a plain per-sample reference of the same semantics --------------------------------------


def reference_convert(args: Any, samples: list[Sample]) -> dict[str, Any]:
    """convert_samples_to_train_data's core keys, one sample at a time in plain Python.

    Rollouts by rollout_id (None: fresh ids); the anchor is the segment with segment_index ==
    num_segments - 1, or a plain rollout's last sample; prompt-equal ``M_P x N / R`` for the
    estimators named by ``args.dressage_prompt_equal_estimators`` (default grpo and
    reinforce_plus_plus_baseline), the rollout's summed mask otherwise.
    """
    estimator = args.advantage_estimator
    named = getattr(args, "dressage_prompt_equal_estimators", None)
    prompt_equal = estimator in (set(named) if named is not None else set(PROMPT_EQUAL))
    used = {s.rollout_id for s in samples if s.rollout_id is not None}
    rollout_ids, fresh = [], 0
    for s in samples:
        if s.rollout_id is None:
            while fresh in used:
                fresh += 1
            used.add(fresh)
            rollout_ids.append(fresh)
        else:
            rollout_ids.append(s.rollout_id)
    members: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rollout_ids):
        members[r].append(i)
    anchor_of: dict[int, int] = {}
    for r, idx in members.items():
        segments = [
            i for i in idx if {"segment_index", "num_segments"} <= samples[i].metadata.keys()
        ]
        if not segments:
            anchor_of[r] = idx[-1]
            continue
        (anchor_of[r],) = [i for i in idx if _is_last_segment(samples[i])]

    masks, mask_sums = [], []
    for s in samples:
        mask = [0] * s.response_length if s.remove_sample else s.loss_mask
        masks.append(mask)
        mask_sums.append(sum(mask))

    raw = [0.0] * len(samples)
    for i in anchor_of.values():
        reward = samples[i].reward
        raw[i] = 0.0 if reward is None and samples[i].remove_sample else float(reward)
    value_of = {r: raw[i] for r, i in anchor_of.items()}
    if args.rewards_normalization and estimator in GROUP_ESTIMATORS:
        value_of = _reference_normalize(args, samples, anchor_of)
    rewards = [value_of[r] for r in rollout_ids]

    per_rollout: dict[int, int] = defaultdict(int)
    for r, m in zip(rollout_ids, mask_sums, strict=True):
        per_rollout[r] += m
    if prompt_equal:
        tokens: dict[int, int] = defaultdict(int)
        for r, i in anchor_of.items():
            tokens[samples[i].group_index] += per_rollout[r]
        prompts_per_rollout = len(tokens) / len(anchor_of)
        denoms = [tokens[s.group_index] * prompts_per_rollout for s in samples]
    else:
        denoms = [float(per_rollout[r]) for r in rollout_ids]
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in samples],
        "sample_indices": [s.index for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": masks,
        "rollout_mask_sums": denoms,
        "rollout_log_probs": [s.rollout_log_probs for s in samples],
    }


def _is_last_segment(sample: Sample) -> bool:
    return bool(sample.metadata["segment_index"] == sample.metadata["num_segments"] - 1)


def _reference_normalize(args: Any, samples: list[Sample], anchor_of: dict[int, int]) -> dict:
    groups: dict[int, list[float]] = defaultdict(list)
    for i in anchor_of.values():
        if not samples[i].remove_sample:
            groups[samples[i].group_index].append(float(samples[i].reward))
    divide = (
        args.grpo_std_normalization
        and args.advantage_estimator != "reinforce_plus_plus_baseline"
        and args.n_samples_per_prompt != 1
    )
    out = {}
    for r, i in anchor_of.items():
        s = samples[i]
        values = groups[s.group_index]
        if s.remove_sample:
            out[r] = 0.0
            continue
        value = float(s.reward) - sum(values) / len(values)
        if divide:
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            value /= std + 1e-6
        out[r] = value
    return out


def check_same(ours: dict[str, Any], reference: dict[str, Any]) -> None:
    for key, expected in reference.items():
        got = ours[key]
        if key in {"rewards", "raw_reward", "rollout_mask_sums"}:
            assert np.allclose(got, expected, rtol=1e-9, atol=1e-9), key
        else:
            assert got == expected, key


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


def _estimator_args(estimator: str, **overrides: Any) -> Any:
    """slime_args for ``estimator``, opting gspo/cispo in to prompt-equal weights."""
    if estimator in OPT_IN:
        overrides.setdefault("dressage_prompt_equal_estimators", [estimator])
    return slime_args(advantage_estimator=estimator, **overrides)


@settings(max_examples=60, deadline=None)
@given(
    splits=two_splits(),
    gbs=st.sampled_from([1, 2, 8, 64, 512]),
    estimator=st.sampled_from([*PROMPT_EQUAL, *OPT_IN]),
)
def test_prompt_weight_does_not_depend_on_how_trajectories_split(
    splits: tuple[list[list[list[int]]], list[list[list[int]]]], gbs: int, estimator: str
) -> None:
    args = _estimator_args(estimator, global_batch_size=gbs)
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
    estimator=st.sampled_from([*PROMPT_EQUAL, *OPT_IN, "ppo", "reinforce_plus_plus"]),
    opt_in=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_the_plain_per_sample_reference(
    splits: tuple[list[list[list[int]]], list[list[list[int]]]],
    estimator: str,
    opt_in: bool,
    seed: int,
) -> None:
    rng = random.Random(seed)
    named = {"dressage_prompt_equal_estimators": [*PROMPT_EQUAL, *OPT_IN]} if opt_in else {}
    args = slime_args(
        advantage_estimator=estimator, global_batch_size=rng.choice([1, 4, 16]), **named
    )
    samples = batch(args, splits[0], None)
    for sample in samples:
        sample.remove_sample = rng.random() < 0.2
    rng.shuffle(samples)
    ours = convert_samples_to_train_data(args, samples)
    check_same(ours, reference_convert(args, samples))


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
    # gspo and cispo are prompt-equal only when the flag names them
    for estimator in ("ppo", "reinforce_plus_plus", "mopd", "gspo", "cispo"):
        args = slime_args(advantage_estimator=estimator, rewards_normalization=False)
        data = convert_samples_to_train_data(args, batch(args, [[[3, 1], [2]]]))
        assert data["rollout_mask_sums"] == [4.0, 4.0, 2.0], estimator


def test_teacher_ids_fill_the_prompt_slot_for_mopd_only() -> None:
    grpo = slime_args()
    samples = batch(grpo, [[[1, 2], [3]]], teacher_id="math-teacher")
    # slime's train-side logging averages every slot it does not know: strings only for MOPD,
    # whose actor takes them out after scoring
    assert "prompt" not in convert_samples_to_train_data(grpo, samples)
    args = slime_args(advantage_estimator="mopd", rewards_normalization=False)
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


# -- slime's DP schedule (docs/slime.md §5): siblings never straddle a step --------------


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


# -- which estimators get prompt-equal denominators -------------------------------------------


def _denominators(**overrides: Any) -> list[float]:
    args = slime_args(rewards_normalization=False, **overrides)
    return convert_samples_to_train_data(args, batch(args, [[[3, 1], [2]]]))["rollout_mask_sums"]


PROMPT_EQUAL_DENOMS = [6 * 1 / 2] * 3  # M_P = 6 over 2 rollouts of 1 prompt
ROLLOUT_DENOMS = [4.0, 4.0, 2.0]


@pytest.mark.parametrize(
    ("estimator", "named", "expected"),
    [
        ("grpo", None, PROMPT_EQUAL_DENOMS),
        ("reinforce_plus_plus_baseline", None, PROMPT_EQUAL_DENOMS),
        ("gspo", None, ROLLOUT_DENOMS),
        ("cispo", None, ROLLOUT_DENOMS),
        ("gspo", ["gspo"], PROMPT_EQUAL_DENOMS),
        ("cispo", "gspo,cispo", PROMPT_EQUAL_DENOMS),
        ("grpo", ["gspo"], ROLLOUT_DENOMS),  # naming replaces the default set
        ("grpo", ["none"], ROLLOUT_DENOMS),
    ],
)
def test_prompt_equal_estimators_default_and_option(
    estimator: str, named: Any, expected: list[float]
) -> None:
    extra = {} if named is None else {"dressage_prompt_equal_estimators": named}
    assert _denominators(advantage_estimator=estimator, **extra) == pytest.approx(expected)


@pytest.mark.parametrize("named", [["ppo"], ["grpo", "none"], "reinforce_plus_plus", []])
def test_prompt_equal_option_rejects_estimators_without_groups(named: Any) -> None:
    with pytest.raises(ValueError, match="--dressage-prompt-equal-estimators"):
        read_args(slime_args(dressage_prompt_equal_estimators=named))


def test_prompt_equal_flag_parses_into_the_attribute_slime_args_reads() -> None:
    parser = argparse.ArgumentParser()
    add_dressage_arguments(parser.add_argument_group("dressage"))
    default = parser.parse_args([])
    assert read_args(default).prompt_equal_estimators == {"grpo", "reinforce_plus_plus_baseline"}
    named = parser.parse_args(["--dressage-prompt-equal-estimators", "gspo", "cispo"])
    assert read_args(named).prompt_equal_estimators == {"gspo", "cispo"}
    with pytest.raises(SystemExit):  # argparse's choices: a typo fails at launch
        parser.parse_args(["--dressage-prompt-equal-estimators", "gpro"])


# -- ours against the design's formula d = M_P x N_P / gbs -----------------------------------


def design_denominators(samples: list[Sample], data: dict[str, Any], gbs: int) -> list[float]:
    """The design's ``M_P x L / gbs`` from the samples alone (L: prompts with a trainable
    token anywhere in the batch; removed samples train nothing)."""
    tokens: dict[int, int] = defaultdict(int)
    for sample, mask in zip(samples, data["loss_masks"], strict=True):
        tokens[sample.group_index] += 0 if sample.remove_sample else sum(mask)
    live = sum(1 for total in tokens.values() if total > 0)
    return [tokens[s.group_index] * live / gbs for s in samples]


@settings(max_examples=60, deadline=None)
@given(
    per_prompt=st.integers(1, 4),
    trainable=st.lists(
        st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=4, max_size=4),
        min_size=1,
        max_size=8,
    ),
    steps=st.integers(1, 4),
    dead=st.sets(st.integers(0, 7)),
    estimator=st.sampled_from([*PROMPT_EQUAL, *OPT_IN]),
)
def test_denominators_relate_to_the_design_formula_as_documented(
    per_prompt: int,
    trainable: list[list[list[int]]],
    steps: int,
    dead: set[int],
    estimator: str,
) -> None:
    """d_design = d_ours x (R / gbs) x (L / N), with dead prompts and several steps per batch;
    and each step's weights sum to (live prompts in the step) x R / (gbs N)."""
    prompts = [
        [[0] * len(split) if p in dead else split for split in splits[:per_prompt]]
        for p, splits in enumerate(trainable)
    ]
    n_prompts, rollouts = len(prompts), len(prompts) * per_prompt
    if n_prompts % steps:
        steps = 1
    gbs = rollouts // steps  # whole prompts per step: gbs is a multiple of per_prompt
    args = _estimator_args(estimator, global_batch_size=gbs, n_samples_per_prompt=per_prompt)
    samples = batch(args, prompts)
    data = convert_samples_to_train_data(args, samples)
    ours = np.array(data["rollout_mask_sums"])
    design = np.array(design_denominators(samples, data, gbs))
    live = sum(1 for splits in prompts if sum(map(sum, splits)) > 0)
    assert design == pytest.approx(ours * (rollouts / gbs) * (live / n_prompts), abs=1e-12)
    assert (ours == 0).tolist() == (design == 0).tolist()  # dead prompts: 0 under both
    if steps == 1 and live == n_prompts:
        assert ours == pytest.approx(design)
    weights = np.array(reducer_weights(data, gbs))
    for step in dp_steps(data["rollout_ids"], gbs):
        live_in_step = {samples[p].group_index for p in step if weights[p] > 0 and ours[p] >= 1}
        clamped = any(0 < ours[p] < 1 for p in step)
        if not clamped:  # slime's clamp max(d, 1) aside
            expected = len(live_in_step) * rollouts / (gbs * n_prompts)
            assert weights[step].sum() == pytest.approx(expected, rel=1e-12, abs=1e-12)


# -- slime's own samples: no write-time record, no (or other) segment metadata ---------------


def plain_sample(index: int, rollout_id: int | None, mask: list[int], **metadata: Any) -> Sample:
    """A sample as slime's own producers leave it (slime/agent/trajectory.py's to_sample)."""
    n = len(mask)
    return Sample(
        index=index,
        group_index=index // 4,
        rollout_id=rollout_id,
        tokens=list(range(3 + n)),
        response_length=n,
        loss_mask=list(mask),
        rollout_log_probs=[-0.5] * n,
        reward=1.0,
        metadata=dict(metadata),
    )


def test_plain_siblings_with_parent_traj_id_and_no_num_segments_are_one_rollout() -> None:
    args = slime_args(advantage_estimator="ppo", rewards_normalization=False)
    samples = [  # one rollout of three plain siblings, then a plain rollout of one
        plain_sample(0, 7, [1, 1], parent_traj_id="s-0", segment_index=0),
        plain_sample(0, 7, [1, 0, 1], parent_traj_id="s-0"),
        plain_sample(0, 7, [1], parent_traj_id="sub-agent"),  # a label, not a key
        plain_sample(1, 8, [1, 1, 1, 1], parent_traj_id="s-1"),
    ]
    samples[2].reward = 0.25  # the anchor (last sibling) carries the rollout's reward
    data = convert_samples_to_train_data(args, samples)
    assert data["rollout_ids"] == [7, 7, 7, 8]
    assert data["rollout_mask_sums"] == [5.0, 5.0, 5.0, 4.0]
    assert data["rewards"] == [0.25, 0.25, 0.25, 1.0]
    assert data["raw_reward"] == [0.0, 0.0, 0.25, 1.0]
    check_same(data, reference_convert(args, samples))


def test_plain_samples_without_metadata_are_single_segment_rollouts() -> None:
    args = slime_args()  # grpo: prompt-equal, group-normalised
    samples = [plain_sample(i, None, [1] * (i + 1)) for i in range(8)]
    data = convert_samples_to_train_data(args, samples)
    assert data["rollout_ids"] == list(range(8))  # slime's fallback: fresh ids
    check_same(data, reference_convert(args, samples))


def test_a_rollout_may_not_mix_segment_and_plain_samples() -> None:
    args = slime_args()
    samples = trajectory(args, template(0, 0), [1, 2], reward=1.0)
    stray = plain_sample(5, samples[0].rollout_id, [1])
    with pytest.raises(ValueError, match="sample index=5 .*field=metadata.segment_index: "):
        convert_samples_to_train_data(args, [*samples, stray])


def test_cold_masks_are_counted_exactly_whatever_their_entries() -> None:
    args = slime_args(advantage_estimator="ppo", rewards_normalization=False)
    masks: list[Any] = [[1, 0, 1], [True, False, True], [2, 1, 0], [0.5, 1.0, 0.0], (1, 1, 0)]
    samples = [plain_sample(i, i, [0, 0, 0]) for i in range(len(masks))]
    for sample, mask in zip(samples, masks, strict=True):
        sample.loss_mask = mask
    data = convert_samples_to_train_data(args, samples)
    assert data["rollout_mask_sums"] == [2.0, 2.0, 3.0, 1.5, 2.0]
    samples[1].loss_mask = [1, "x", 0]
    with pytest.raises(TypeError, match="sample index=1 .*field=loss_mask"):
        convert_samples_to_train_data(args, samples)


@pytest.mark.parametrize("where", ["first", "last"])
def test_cold_log_probs_are_checked_on_a_spread_that_holds_the_ends(where: str) -> None:
    args = slime_args(advantage_estimator="ppo")
    samples = [plain_sample(i, i, [1, 1]) for i in range(10 * convert_module.SPOT_CHECKS)]
    bad = samples[0 if where == "first" else -1]
    bad.rollout_log_probs = [-0.1, math.nan]
    with pytest.raises(ValueError, match=f"sample index={bad.index} .*field=rollout_log_probs"):
        convert_samples_to_train_data(args, samples)


def test_teacher_log_probs_are_finite_on_every_sample() -> None:
    args = slime_args(advantage_estimator="ppo")
    samples = [plain_sample(i, i, [1, 1]) for i in range(10 * convert_module.SPOT_CHECKS)]
    for sample in samples:
        sample.teacher_log_probs = [-0.2, -0.3]
    bad = samples[37]  # off the spread: finiteness is still checked
    bad.teacher_log_probs = [-0.2, math.inf]
    with pytest.raises(ValueError, match="sample index=37 .*field=teacher_log_probs"):
        convert_samples_to_train_data(args, samples)


# -- the bench: its baseline is slime's own converter, so it needs slime ----------------------


def test_bench_without_slime_root_fails_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLIME_ROOT"}
    done = subprocess.run(
        [sys.executable, "bench/convert.py", "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "bench/convert.py: SLIME_ROOT is not set: point it at a slime checkout "
        "(SLIME_ROOT=/path/to/slime)"
    ]
