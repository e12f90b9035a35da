"""Benchmark: converting a multi-segment rollout batch into slime train_data.

    .venv/bin/python bench/convert.py                                    # 4,096 x 8,192 tokens
    .venv/bin/python bench/convert.py --prompts 64 --samples 256 --tokens 1024   # quick

Batch: ``--samples`` slime ``Sample`` s of ``--tokens`` tokens each (Python lists, as slime
holds them) from ``--prompts`` prompts with 2 trajectories each, every trajectory split into a
random number of segments; written by ``write_sample_from_segment`` like a real rollout.

Ours: :func:`dressage.rollout.convert_samples.convert_samples_to_train_data` (grpo, prompt-equal
denominators, reward post-processing included). Baseline, in the same run and on the same
samples: :func:`plain_convert`, a plain per-sample Python implementation of the same semantics
(it recounts every loss mask and checks every log-prob list, as a converter that keeps no
write-time facts must). Both outputs are compared key by key before timing. Target: >= 3x.
The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dressage.rollout.convert_samples import convert_samples_to_train_data  # noqa: E402
from dressage.rollout.multi_segment import expand_segments_to_samples  # noqa: E402
from dressage.trajectory import Segment  # noqa: E402
from dressage.types import Sample  # noqa: E402

TARGET = 3.0
VOCAB = 151_000
GROUP_ESTIMATORS = {"grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"}


# -- the baseline: same semantics, one sample at a time, plain Python --------------------------


def plain_convert(args: Any, samples: list[Sample]) -> dict[str, Any]:
    """Per-sample Python version of convert_samples_to_train_data's core keys."""
    estimator = args.advantage_estimator
    n = len(samples)
    rollout_ids, used, fresh = [], {s.rollout_id for s in samples if s.rollout_id is not None}, 0
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
        if len(idx) == 1 and "num_segments" not in samples[idx[0]].metadata:
            anchor_of[r] = idx[0]
            continue
        found = [i for i in idx if _is_last_segment(samples[i])]
        if len(found) != 1:
            raise ValueError(f"rollout {r}: {len(found)} anchors")
        anchor_of[r] = found[0]

    masks, mask_sums = [], []
    for s in samples:
        if s.loss_mask is None or len(s.loss_mask) != s.response_length:
            raise ValueError(f"sample {s.index}: loss_mask does not match response_length")
        lp = s.rollout_log_probs
        if lp is not None and (len(lp) != s.response_length or not math.isfinite(sum(lp))):
            raise ValueError(f"sample {s.index}: bad rollout_log_probs")
        mask = [0] * s.response_length if s.remove_sample else s.loss_mask
        masks.append(mask)
        mask_sums.append(sum(mask))

    raw = [0.0] * n
    for i in anchor_of.values():
        reward = samples[i].reward
        raw[i] = 0.0 if reward is None and samples[i].remove_sample else float(reward)
    value_of = {r: raw[i] for r, i in anchor_of.items()}
    if args.rewards_normalization and estimator in GROUP_ESTIMATORS:
        value_of = _plain_normalize(args, samples, anchor_of)
    rewards = [value_of[r] for r in rollout_ids]

    per_rollout: dict[int, int] = defaultdict(int)
    for r, m in zip(rollout_ids, mask_sums, strict=True):
        per_rollout[r] += m
    if estimator in GROUP_ESTIMATORS:
        tokens: dict[int, int] = defaultdict(int)
        count: dict[int, int] = defaultdict(int)
        for r, i in anchor_of.items():
            tokens[samples[i].group_index] += per_rollout[r]
            count[samples[i].group_index] += 1
        # M_P x N / gbs with N = gbs x prompts / rollouts: the prompts of one step
        prompts_per_rollout = len(count) / len(anchor_of)
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


def _plain_normalize(args: Any, samples: list[Sample], anchor_of: dict[int, int]) -> dict:
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
        mean = sum(values) / len(values)
        value = float(s.reward) - mean
        if divide:
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            value /= std + 1e-6
        out[r] = value
    return out


# -- the batch ---------------------------------------------------------------------------------


def _segment(rng: np.random.Generator, session: str, k: int, n_tokens: int) -> Segment:
    prompt = int(rng.integers(n_tokens // 32, n_tokens // 4))
    mask = np.zeros(n_tokens, dtype=np.int8)
    pos, trainable = prompt, True
    while pos < n_tokens:  # assistant turns (trained) alternate with tool output (not)
        length = int(rng.integers(50, 500) if trainable else rng.integers(20, 300))
        mask[pos : pos + length] = int(trainable)
        pos, trainable = pos + length, not trainable
    logprobs = np.where(mask == 1, -rng.random(n_tokens) * 4, 0.0)
    switch = int(rng.integers(prompt, n_tokens))  # a weight update somewhere in the segment
    versions = np.where(mask == 1, np.where(np.arange(n_tokens) < switch, 3, 4), -1)
    return Segment(
        session_id=session,
        segment_index=k,
        tokens=rng.integers(0, VOCAB, n_tokens).tolist(),
        full_loss_mask=mask.tolist(),
        full_logprobs=logprobs.tolist(),
        messages=[],
        finish_reason="length" if rng.random() < 0.05 else "stop",
        full_versions=versions.tolist(),
        prompt_length=prompt,
    )


def make_batch(
    args: Any, n_prompts: int, n_samples: int, n_tokens: int, seed: int = 0
) -> list[Sample]:
    rng = np.random.default_rng(seed)
    n_traj = n_prompts * args.n_samples_per_prompt
    if n_samples < n_traj:
        raise ValueError(f"{n_samples} samples cannot hold {n_traj} trajectories")
    splits = 1 + rng.multinomial(n_samples - n_traj, np.full(n_traj, 1 / n_traj))
    samples: list[Sample] = []
    for t in range(n_traj):
        group = t // args.n_samples_per_prompt
        template = Sample(
            index=t, group_index=group, prompt="p", metadata={"instance_id": f"row-{group}"}
        )
        session = f"sess-{t}"
        segments = [_segment(rng, session, k, n_tokens) for k in range(int(splits[t]))]
        siblings = expand_segments_to_samples(template, segments, args=args)
        siblings[-1].reward = float(rng.integers(0, 2))
        siblings[-1].remove_sample = bool(rng.random() < 0.01)
        samples += siblings
    return samples


# -- timing ------------------------------------------------------------------------------------


def _interleaved_medians(fns: list[Any], repeats: int) -> list[float]:
    """Median wall time of each function, run in turns so that load changes hit both alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def check_same(ours: dict[str, Any], plain: dict[str, Any]) -> None:
    for key, expected in plain.items():
        got = ours[key]
        if key in {"rewards", "raw_reward", "rollout_mask_sums"}:
            if not np.allclose(got, expected, rtol=1e-9, atol=1e-9):
                raise AssertionError(f"{key} differs between ours and the baseline")
        elif got != expected:
            raise AssertionError(f"{key} differs between ours and the baseline")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    args = SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=2,
        rollout_batch_size=opts.prompts,
        global_batch_size=opts.prompts * 2,
        max_tokens_per_gpu=opts.tokens,
        context_parallel_size=1,
    )
    start = time.perf_counter()
    samples = make_batch(args, opts.prompts, opts.samples, opts.tokens)
    total = sum(len(s.tokens) for s in samples)
    print(f"built {len(samples)} samples, {total:,} tokens in {time.perf_counter() - start:.1f}s")

    check_same(convert_samples_to_train_data(args, samples), plain_convert(args, samples))
    ours, baseline = _interleaved_medians(
        [
            lambda: convert_samples_to_train_data(args, samples),
            lambda: plain_convert(args, samples),
        ],
        opts.repeats,
    )
    ratio = baseline / ours
    print(f"baseline (plain per-sample Python): {baseline * 1e3:8.1f} ms")
    print(f"ours (convert_samples_to_train_data): {ours * 1e3:8.1f} ms   ratio {ratio:.1f}x")
    summary = {
        "metric": f"convert {len(samples)} samples x {opts.tokens} tokens to train_data",
        "unit": "s",
        "baseline": round(baseline, 6),
        "ours": round(ours, 6),
        "ratio": round(ratio, 2),
        "target": TARGET,
        "met": ratio >= TARGET,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
