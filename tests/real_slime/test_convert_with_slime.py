"""Our converter on slime's own Samples, against slime's default converter and through its DP split.

Real ``slime.utils.types.Sample`` objects (``SLIME_ROOT`` is first on the path, so
``dressage.types.Sample`` is slime's class) go through ``write_sample_from_segment``,
``expand_segments_to_samples``, ``reward_post_process`` and
``convert_samples_to_train_data``; the train_data then goes through slime's own
``RolloutManager._split_train_data_by_dp`` (its ``build_dp_schedule``) and its trainer-side
``process_rollout_data``, per DP rank. slime's default ``_convert_samples_to_train_data`` (with
``_post_process_rewards``) runs on the same single-segment batches as ours, and slime's own
multi-sample producer (``slime/agent/trajectory.py``) supplies plain sibling samples.
``RolloutManager`` is ``ray.remote``-decorated; its methods are called on the plain class
(``__ray_actor_class__``) with ``ray.put``/``ray.get`` replaced by the identity, no Ray started.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_convert_with_slime.py
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dressage.rollout.artifacts.samples import write_sample_from_segment
from dressage.rollout.convert_samples import convert_samples_to_train_data
from dressage.rollout.multi_segment import expand_segments_to_samples, mark_aborted_no_grad
from dressage.training.reward_post_process import reward_post_process
from dressage.types import Sample
from tests.helpers import REPO
from tests.real_slime.slime_parts import bare_manager, split_per_rank
from tests.rollout.factories import segment, slime_args, template

pytestmark = pytest.mark.unit

DP_KEYS = {  # what slime's split ships per rank for our train_data, plus process_rollout_data's
    "partition",
    "tokens",
    "response_lengths",
    "rewards",
    "truncated",
    "loss_masks",
    "sample_indices",
    "rollout_ids",
    "rollout_mask_sums",
    "rollout_log_probs",
    "source_names",
    "prompt",
    "raw_reward",
    "total_lengths",
    "global_batch_sizes",
    "num_microbatches",
    "micro_batch_indices",
    "local_raw_reward",
}


def tier_args(**overrides: Any) -> SimpleNamespace:
    """The flags our hooks and slime's converter, split and schedule read."""
    values: dict[str, Any] = {
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 64,
        "micro_batch_size": 1,
        "balance_data": False,
        "balance_by_flops": False,
        "rollout_data_transport": "object-store",
        **overrides,
    }
    return slime_args(**values)


def steps_of(ranks: list[dict[str, Any]]) -> dict[int, int]:
    """Global sample position -> optimizer step, read from each rank's micro-batch schedule."""
    out: dict[int, int] = {}
    for data in ranks:
        batches = iter(data["micro_batch_indices"])
        for step, count in enumerate(data["num_microbatches"]):
            for _ in range(count):
                for local in next(batches):
                    position = data["partition"][local]
                    assert position not in out, f"sample {position} placed twice"
                    out[position] = step
    return out


# -- our hooks on real slime Samples, through slime's DP split --------------------------------


def written_batch(args: Any, seed: int) -> list[Sample]:
    """4 prompts x 2 trajectories of 1-3 segments; one plain single-segment write, one
    removed trajectory and one failed one (mark_aborted_no_grad); two teachers."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    for t in range(8):
        group, teacher = t // 2, ("calc", "look")[t // 4]
        tmpl = template(t, group, teacher_id=teacher)
        if t == 3:  # written alone: no segment keys, a plain single-sample rollout
            tmpl.rollout_id = t
            samples.append(write_sample_from_segment(tmpl, segment(f"s-{t}", seed=t), args=args))
            samples[-1].reward = 1.0
            continue
        if t == 6:
            samples.append(mark_aborted_no_grad(tmpl, reason="agent crashed"))
            continue
        segments = [
            segment(f"s-{t}", k, runs=((1, rng.randint(1, 9)), (0, 2)), seed=10 * t + k)
            for k in range(rng.randint(1, 3))
        ]
        siblings = expand_segments_to_samples(tmpl, segments, args=args, agent_response="4")
        siblings[-1].reward = float(rng.random() < 0.5)
        siblings[-1].remove_sample = t == 5
        samples += siblings
    return samples


OBJECTIVES = {  # slime options of each objective (MOPD: teacher ids in the prompt slot)
    "grpo": {"advantage_estimator": "grpo"},
    "mopd": {"advantage_estimator": "mopd", "rewards_normalization": False},
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("dp_size", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_written_samples_through_our_hooks_and_slimes_dp_split(
    dp_size: int, seed: int, objective: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slime.utils.types import Sample as SlimeSample

    args = tier_args(
        global_batch_size=4, n_samples_per_prompt=2, rollout_batch_size=4, **OBJECTIVES[objective]
    )
    samples = written_batch(args, seed)
    assert all(type(s) is SlimeSample for s in samples)
    raw, rewards = reward_post_process(args, samples)
    data = convert_samples_to_train_data(args, samples)
    assert (data["raw_reward"], data["rewards"]) == (raw, rewards)
    mopd = objective == "mopd"
    if mopd:
        assert data["prompt"] == [s.metadata["teacher_id"] for s in samples]
    else:  # slime's train-side logging would average the strings
        assert "prompt" not in data

    ranks = split_per_rank(args, data, dp_size, monkeypatch)
    step = steps_of(ranks)
    assert sorted(step) == list(range(len(samples)))  # 8 rollouts, gbs 4: nothing dropped
    by_rollout: dict[int, set[int]] = defaultdict(set)
    for position, rollout_id in enumerate(data["rollout_ids"]):
        by_rollout[rollout_id].add(step[position])
    assert all(len(steps) == 1 for steps in by_rollout.values())  # never straddle steps
    per_step: dict[int, set[int]] = defaultdict(set)
    for position, s in step.items():
        per_step[s].add(data["rollout_ids"][position])
    assert [len(per_step[s]) for s in sorted(per_step)] == [4, 4]
    for rank in ranks:
        assert set(rank) == (DP_KEYS if mopd else DP_KEYS - {"prompt"})
        part = rank["partition"]
        if mopd:
            assert rank["prompt"] == [data["prompt"][i] for i in part]
        assert rank["rollout_mask_sums"].tolist() == pytest.approx(
            [data["rollout_mask_sums"][i] for i in part]
        )
        assert rank["global_batch_sizes"] == [4, 4]
        assert rank["local_raw_reward"] == [raw[i] for i in part]


# -- slime's default converter against ours on single-segment batches -------------------------


SCENARIOS = ["plain", "no_rollout_ids", "removed", "raw_reward", "log_probs", "teacher", "no_mask"]
ESTIMATORS = [  # (estimator, rewards_normalization)
    ("ppo", True),
    ("reinforce_plus_plus", True),
    ("gspo", True),  # group-normalised, not prompt-equal unless the flag names it
    ("grpo", False),
    ("grpo", True),
    ("reinforce_plus_plus_baseline", True),
]
PER_PROMPT, PROMPTS = 4, 3


def plain_batch(scenario: str, seed: int) -> list[Sample]:
    """Plain slime Samples, prompt by prompt as slime's data source orders them."""
    rng = random.Random(seed)
    out = []
    for i in range(PER_PROMPT * PROMPTS):
        n = rng.randint(1, 12)
        mask = [rng.randint(0, 1) for _ in range(n)]
        sample = Sample(
            index=i,
            group_index=i // PER_PROMPT,
            rollout_id=None if scenario == "no_rollout_ids" else 100 + i,
            tokens=[rng.randrange(1000) for _ in range(rng.randint(1, 5) + n)],
            response_length=n,
            loss_mask=None if scenario == "no_mask" and i % 3 == 0 else mask,
            reward=float(rng.random() < 0.5),
            status=Sample.Status.TRUNCATED if i % 5 == 0 else Sample.Status.COMPLETED,
        )
        if scenario == "removed":
            sample.remove_sample = i % 4 == 1
        if scenario == "raw_reward" and i % 2:
            sample.metadata["raw_reward"] = 10.0 + i
        if scenario in ("log_probs", "teacher"):
            sample.rollout_log_probs = [-rng.random() for _ in range(n)]
        if scenario == "teacher":
            sample.teacher_log_probs = [-rng.random() for _ in range(n)]
        out.append(sample)
    return out


def assert_stated_relation(ours: list[float], theirs: list[int], samples: list[Sample]) -> None:
    """ours = M_P x N / R, where slime's entry is the rollout's summed mask (one sample each)."""
    per_prompt: dict[int, float] = defaultdict(float)
    for sample, total in zip(samples, theirs, strict=True):
        per_prompt[sample.group_index] += total
    factor = len(per_prompt) / len(samples)
    assert ours == pytest.approx([per_prompt[s.group_index] * factor for s in samples])


@pytest.mark.parametrize(("estimator", "normalize"), ESTIMATORS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_slimes_default_and_ours_agree_on_single_segment_batches(
    scenario: str, estimator: str, normalize: bool
) -> None:
    args = tier_args(
        advantage_estimator=estimator,
        rewards_normalization=normalize,
        n_samples_per_prompt=PER_PROMPT,
        rollout_batch_size=PROMPTS,
        global_batch_size=PER_PROMPT * PROMPTS,
    )
    batch = plain_batch(scenario, seed=len(scenario))
    theirs = bare_manager(args)._convert_samples_to_train_data(copy.deepcopy(batch))
    ours = convert_samples_to_train_data(args, copy.deepcopy(batch))
    assert list(ours) == list(theirs)
    for key in set(theirs) - {"rewards", "raw_reward", "rollout_mask_sums"}:
        assert ours[key] == theirs[key], key
    assert ours["raw_reward"] == theirs["raw_reward"]
    normalizes = normalize and estimator not in ("ppo", "reinforce_plus_plus")
    if not normalizes:
        assert ours["rewards"] == theirs["rewards"]
    else:  # slime keeps removed samples in the statistics, we leave them out
        clean = [
            i
            for i, s in enumerate(batch)
            if not any(t.remove_sample for t in batch if t.group_index == s.group_index)
        ]
        got, expected = np.array(ours["rewards"])[clean], np.array(theirs["rewards"])[clean]
        assert got == pytest.approx(expected, abs=1e-5)  # slime's float32
    if estimator in ("grpo", "reinforce_plus_plus_baseline"):
        assert_stated_relation(ours["rollout_mask_sums"], theirs["rollout_mask_sums"], batch)
    else:
        assert ours["rollout_mask_sums"] == theirs["rollout_mask_sums"]


# -- plain slime samples with parent_traj_id and no num_segments ------------------------------


def trajectory_samples(sid: str, index: int, group: int, reward: float) -> list[Sample]:
    """slime's own multi-sample producer: a re-tokenised turn forks the trajectory in two."""
    from slime.agent.trajectory import TrajectoryManager, TurnRecord

    manager = TrajectoryManager(fork_threshold_tokens=1)
    first = [{"role": "user", "content": f"q{index}"}]
    answer = {"role": "assistant", "content": "a"}
    turn = TurnRecord([1, 2, 3], [10, 11 + index], "stop", [-0.1, -0.2])
    manager.record_turn(sid, turn=turn, prompt_messages=first, response_message=answer)
    drifted = TurnRecord([1, 9, 3, 10, 11 + index, 20], [12, 13, 14], "stop", [-0.3] * 3)
    manager.record_turn(
        sid,
        turn=drifted,
        prompt_messages=[*first, answer, {"role": "user", "content": "again"}],
        response_message={"role": "assistant", "content": "b"},
    )
    base = Sample(index=index, group_index=group, prompt="p")
    return manager.get_trajectory(
        sid, base_sample=base, reward=reward, extra_metadata={"parent_traj_id": sid}
    )


@pytest.mark.parametrize("dp_size", [1, 2])
def test_slimes_own_sibling_samples_convert_and_stay_in_one_step(
    dp_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples: list[Sample] = []
    for index in range(4):
        samples += trajectory_samples(f"sid-{index}", index, index // 2, float(index % 2))
    assert len(samples) == 8
    assert all("parent_traj_id" in s.metadata and "num_segments" not in s.metadata for s in samples)
    args = tier_args(advantage_estimator="ppo", global_batch_size=2, n_samples_per_prompt=2)
    data = convert_samples_to_train_data(args, samples)
    assert data["rollout_ids"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert data["rewards"] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]  # the anchor's, broadcast
    per_rollout = [
        sum(samples[2 * r].loss_mask) + sum(samples[2 * r + 1].loss_mask) for r in range(4)
    ]
    assert data["rollout_mask_sums"] == [float(per_rollout[r]) for r in data["rollout_ids"]]
    step = steps_of(split_per_rank(args, data, dp_size, monkeypatch))
    assert sorted(step) == list(range(8))
    assert all(step[2 * r] == step[2 * r + 1] for r in range(4))


def test_bench_quick_run_compares_with_slimes_converter() -> None:
    """The bench runs against slime and ends with its JSON summary (timings are not asserted)."""
    done = subprocess.run(
        [sys.executable, "bench/convert.py", "--quick"],
        cwd=REPO,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert "outputs agree" in done.stdout
    summary = json.loads(lines[-1])
    required = {"metric", "unit", "baseline", "ours", "ratio", "target", "met"}
    assert required | {"ours_cold", "ours_record", "ratio_cold", "ratio_record"} <= set(summary)
    assert summary["ours"] == summary["ours_cold"] and isinstance(summary["met"], bool)
    assert summary["met"] == (
        summary["ratio_cold"] >= summary["target_cold"]
        and summary["ratio_record"] >= summary["target_record"]
    )
