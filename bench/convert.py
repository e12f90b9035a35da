"""Benchmark: our train_data converter against slime's own default converter, same batch, same run.

    SLIME_ROOT=/path/to/slime .venv/bin/python bench/convert.py          # 4,096 x 8,192 tokens
    SLIME_ROOT=/path/to/slime .venv/bin/python bench/convert.py --quick  # 256 x 1,024, seconds

Baseline: slime's ``RolloutManager._convert_samples_to_train_data`` with its
``_post_process_rewards`` (grpo, group normalisation), loaded from ``$SLIME_ROOT`` with the test
tier's stand-ins for the GPU-only packages it imports (``tests/real_slime/standins.py``), called on
the plain class without Ray. slime's default knows no segments, so the batch is single-segment:
``--samples`` trajectories of ``--tokens`` tokens each (Python lists, as slime holds them),
``--per-prompt`` per prompt, 1% removed, written by ``write_sample_from_segment``.

Ours, :func:`dressage.rollout.convert_samples.convert_samples_to_train_data` (prompt-equal
denominators, reward post-processing included), twice:

* cold: the same samples as plain slime samples (metadata without dressage's keys, so no
  write-time record and no segment metadata): every loss mask is counted;
* record: the samples as dressage writes them (``metadata["dressage_written"]``).

Before timing, the outputs are compared: the same keys in the same order, equal values where
prompt-equal weights do not apply, group-normalised rewards equal to float32 precision on
groups without removed samples (slime keeps removed samples in the statistics, we do not), and
``rollout_mask_sums`` in the relation the converter's docstring states. Timing: each variant
runs once per round, in rotating order, with the collector off (the batch holds millions of
objects; a collection inside one timing would swamp it); the median over ``--repeats`` rounds
is reported. Targets: cold at least as fast as slime's default, with the record >= 2x. The last
line printed is the JSON summary; ``met`` is true only when both targets were reached.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
VOCAB = 151_000
TARGET_COLD = 1.0
TARGET_RECORD = 2.0
DRESSAGE_KEYS = ("parent_traj_id", "segment_index", "num_segments", "instance_id", "dressage_")


def _fail(message: str) -> None:
    sys.exit(f"bench/convert.py: {message}")


def load_slime(root_env: str | None) -> Any:
    """slime's plain ``RolloutManager`` class from ``$SLIME_ROOT`` (stand-ins for sglang etc.).

    ``SLIME_ROOT`` goes first on ``sys.path`` before dressage is imported, so that
    ``dressage.types.Sample`` is slime's own class, as on a cluster.
    """
    if not root_env:
        _fail("SLIME_ROOT is not set: point it at a slime checkout (SLIME_ROOT=/path/to/slime)")
    root = Path(root_env).resolve()
    if not (root / "slime" / "ray" / "rollout.py").is_file():
        _fail(f"SLIME_ROOT={root} is not a slime checkout (no slime/ray/rollout.py)")
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(REPO))
    standins = _load_file("dressage_bench_standins", REPO / "tests" / "real_slime" / "standins.py")
    standins.install()
    import slime.ray.rollout as slime_rollout

    # ray.remote wraps the class; the plain one is what a Ray worker would instantiate
    return slime_rollout.RolloutManager.__ray_actor_class__


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slime_converter(manager_class: Any, args: Any) -> Callable[[list[Any]], dict[str, Any]]:
    """slime's default converter bound to a bare manager (no __init__: it starts engines)."""
    manager = object.__new__(manager_class)
    manager.args = args
    manager.custom_convert_samples_to_train_data_func = None
    manager.custom_reward_post_process_func = None
    return manager._convert_samples_to_train_data  # type: ignore[no-any-return]


# -- the batch ---------------------------------------------------------------------------------


def _segment(rng: np.random.Generator, session: str, n_tokens: int) -> Any:
    from dressage.trajectory import Segment

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
        segment_index=0,
        tokens=rng.integers(0, VOCAB, n_tokens).tolist(),
        full_loss_mask=mask.tolist(),
        full_logprobs=logprobs.tolist(),
        messages=[],
        finish_reason="length" if rng.random() < 0.05 else "stop",
        full_versions=versions.tolist(),
        prompt_length=prompt,
    )


def make_batch(args: Any, n_samples: int, n_tokens: int, seed: int = 0) -> list[Any]:
    """Single-segment trajectories, prompt by prompt, as dressage writes them."""
    from dressage.rollout.multi_segment import expand_segments_to_samples
    from dressage.types import Sample

    rng = np.random.default_rng(seed)
    samples = []
    for t in range(n_samples):
        group = t // args.n_samples_per_prompt
        template = Sample(
            index=t, group_index=group, prompt="p", metadata={"instance_id": f"row-{group}"}
        )
        segment = _segment(rng, f"sess-{t}", n_tokens)
        (sample,) = expand_segments_to_samples(template, [segment], args=args)
        sample.reward = float(rng.integers(0, 2))
        sample.remove_sample = bool(rng.random() < 0.01)
        samples.append(sample)
    return samples


def plain_copies(samples: list[Any]) -> list[Any]:
    """The same samples as slime's own producers leave them: no dressage metadata at all.

    Shallow copies: token, mask and log-prob lists are shared, only metadata is new.
    """
    out = []
    for sample in samples:
        plain = copy.copy(sample)
        plain.metadata = {
            k: v for k, v in sample.metadata.items() if not k.startswith(DRESSAGE_KEYS)
        }
        out.append(plain)
    return out


# -- checks ------------------------------------------------------------------------------------


def check_against_slime(ours: dict[str, Any], slime: dict[str, Any], samples: list[Any]) -> None:
    """Keys, values and the stated denominator relation (see the module docstring)."""
    if list(ours) != list(slime):
        raise AssertionError(f"keys differ: ours {list(ours)} vs slime {list(slime)}")
    exact = set(slime) - {"rewards", "raw_reward", "rollout_mask_sums"}
    for key in sorted(exact):
        if ours[key] != slime[key]:
            raise AssertionError(f"{key} differs between ours and slime's default")
    if not np.allclose(ours["raw_reward"], slime["raw_reward"], rtol=0, atol=0):
        raise AssertionError("raw_reward differs between ours and slime's default")
    groups = np.array([s.group_index for s in samples])
    removed_groups = {s.group_index for s in samples if s.remove_sample}
    clean = ~np.isin(groups, list(removed_groups))
    got, expected = np.array(ours["rewards"])[clean], np.array(slime["rewards"])[clean]
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        raise AssertionError("group-normalised rewards differ beyond float32 precision")
    # ours = M_P x N / R where slime's entry is the rollout's summed mask (single segments)
    per_prompt: dict[int, float] = defaultdict(float)
    for group, total in zip(groups.tolist(), slime["rollout_mask_sums"], strict=True):
        per_prompt[group] += total
    factor = len(per_prompt) / len(samples)
    stated = [per_prompt[g] * factor for g in groups.tolist()]
    if not np.allclose(ours["rollout_mask_sums"], stated, rtol=1e-12, atol=1e-9):
        raise AssertionError("rollout_mask_sums are not M_P x prompts / rollouts")


# -- timing ------------------------------------------------------------------------------------


def interleaved_medians(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall time of each function; rounds rotate the order so drift hits all alike."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--per-prompt", type=int, default=8, help="trajectories per prompt")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="256 x 1,024 tokens, 3 rounds")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.samples, opts.tokens, opts.repeats = 256, 1024, 3
    if opts.samples % opts.per_prompt:
        parser.error("--samples must be a multiple of --per-prompt")
    manager_class = load_slime(os.environ.get("SLIME_ROOT", "").strip() or None)
    from dressage.rollout.convert_samples import convert_samples_to_train_data

    args = SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=opts.per_prompt,
        rollout_batch_size=opts.samples // opts.per_prompt,
        global_batch_size=opts.samples // 2,
        max_tokens_per_gpu=opts.tokens,
        context_parallel_size=1,
        reward_key=None,
        rollout_top_p=1.0,
    )
    gc.disable()  # millions of new objects and no cycles: collections only cost time
    start = time.perf_counter()
    recorded = make_batch(args, opts.samples, opts.tokens)
    cold = plain_copies(recorded)
    for_slime = [copy.copy(s) for s in recorded]  # slime rebinds loss_mask of removed samples
    total = sum(len(s.tokens) for s in recorded)
    print(f"built {len(recorded)} samples, {total:,} tokens in {time.perf_counter() - start:.1f}s")

    slime_convert = slime_converter(manager_class, args)
    baseline_data = slime_convert(for_slime)
    cold_data = convert_samples_to_train_data(args, cold)
    record_data = convert_samples_to_train_data(args, recorded)
    check_against_slime(cold_data, baseline_data, recorded)
    check_against_slime(record_data, baseline_data, recorded)
    print("outputs agree: keys, values, rewards (float32), rollout_mask_sums = M_P x N / R")

    gc.collect()
    gc.freeze()  # the batch is permanent: keep it out of any collection
    medians = interleaved_medians(
        {
            "slime": lambda: slime_convert(for_slime),
            "cold": lambda: convert_samples_to_train_data(args, cold),
            "record": lambda: convert_samples_to_train_data(args, recorded),
        },
        opts.repeats,
    )
    baseline, ours_cold, ours_record = medians["slime"], medians["cold"], medians["record"]
    ratio_cold, ratio_record = baseline / ours_cold, baseline / ours_record
    print(f"slime default (baseline):         {baseline * 1e3:8.1f} ms")
    print(f"ours cold (no write-time record): {ours_cold * 1e3:8.1f} ms   {ratio_cold:.2f}x")
    print(f"ours with the record:             {ours_record * 1e3:8.1f} ms   {ratio_record:.2f}x")
    summary = {
        "metric": f"convert {len(recorded)} samples x {opts.tokens} tokens to train_data "
        "(grpo, single-segment) vs slime's default converter",
        "unit": "s",
        "baseline": round(baseline, 6),
        "ours": round(ours_cold, 6),
        "ratio": round(ratio_cold, 3),
        "target": TARGET_COLD,
        "ours_cold": round(ours_cold, 6),
        "ours_record": round(ours_record, 6),
        "ratio_cold": round(ratio_cold, 3),
        "ratio_record": round(ratio_record, 3),
        "target_cold": TARGET_COLD,
        "target_record": TARGET_RECORD,
        "repeats": opts.repeats,
        "met": ratio_cold >= TARGET_COLD and ratio_record >= TARGET_RECORD,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
