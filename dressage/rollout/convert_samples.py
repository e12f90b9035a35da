"""Samples to slime train_data with prompt-equal loss weights (a slime converter hook).

    --custom-convert-samples-to-train-data-path \\
        dressage.rollout.convert_samples.convert_samples_to_train_data

This replaces slime's whole default converter, reward post-processing included (docs/
slime.md §2, §3.2), so it calls :func:`~dressage.training.reward_post_process` itself and emits
every key slime's default emits, in its order, plus, for MOPD (``--advantage-estimator mopd``,
which the MOPD drivers set), ``prompt``: the per-sample ``teacher_id``. slime forwards that slot
to each trainer rank (§3.3); its train-side logging would average those strings (§3.4), so
only the MOPD actor, which removes the slot after scoring, may receive it, and other
objectives never get it, even when their datasets name teachers.

Tests and the speed comparison against slime's own converter::

    .venv/bin/python -m pytest tests/rollout/test_convert_samples.py -q -p no:cacheprovider
    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime -q -p no:cacheprovider
    SLIME_ROOT=/path/to/slime .venv/bin/python bench/convert.py

slime's own samples
-------------------
Samples that dressage did not write (no ``metadata["dressage_written"]``, segment metadata
under other names or none) convert too. A sample is a segment of a multi-segment trajectory
only when it carries both ``segment_index`` and ``num_segments``; any other sample is a plain
slime sample, grouped with its siblings by ``rollout_id`` alone (``None`` ids get fresh ones, as
slime's default does), and a plain rollout of several samples is one trajectory whose anchor is
its last sample in batch order. So a sample with ``parent_traj_id`` and no ``num_segments`` is a
plain sample (its ``parent_traj_id`` a label), never an error: dressage writes the three keys
together, and slime's own multi-sample producers (``slime/agent/trajectory.py``, the fan-out
rollouts) tie siblings by ``rollout_id`` and give each the trajectory's reward.
:mod:`dressage.slime.layout` has the whole rule.

Prompt-equal weights
--------------------
slime's reducer (§3.4) turns a step's loss into ``(1/G) sum_i sum_t x_it m_it / max(d_i, 1)``
where ``i`` runs over the step's samples, ``m`` is the loss mask, ``d_i`` the sample's
``rollout_mask_sums`` entry and ``G = global_batch_size`` (rollouts per step). So token ``t``
of sample ``i`` weighs ``m_it / (G max(d_i, 1))``. slime's own ``d_i`` (the rollout's summed
mask) makes every rollout one token mean of weight ``1/G``, so a prompt whose trajectories
split into several samples would count as often as it has samples in a naive per-sample mean.
Prompt-equal weights make every prompt count once, as one token mean over all its trainable
tokens, whichever trajectory or segment they are in.

For a prompt ``P`` of the batch let ``M_P`` be its trainable tokens over all its trajectories
and segments (removed samples count 0); let the batch hold ``R`` rollouts of ``N`` prompts,
``L`` of them live (at least one trainable token), and ``gbs`` rollouts per step, so
``S = R / gbs`` optimizer steps. Every sample of ``P`` gets

    d_i = M_P x N / R                                               (ours)

The design states ``d_i = M_P x L / gbs``. The exact relation, for every sample:

    d_design = d_ours x (R / gbs) x (L / N) = d_ours x S x (live fraction of prompts)

They agree when the batch is one step and no prompt is dead; a dead prompt has ``M_P = 0``
and ``d = 0`` under both (it trains nothing). We keep ours: each live prompt weighs
``R / (gbs N)`` (``n / gbs`` when every prompt has its ``n = R / N`` trajectories) whatever the
number of steps, so with whole prompts per step (``gbs`` a multiple of ``n``) a step's weights
sum to ``(live prompts in the step) x R / (gbs N)``: 1 when its prompts are live, as slime's
default sums to 1 when its rollouts are, and a dead prompt lowers its step's total as a dead
rollout does in slime's default. The design's batch-wide ``L`` makes every step of a
multi-step batch sum to about ``1 / S`` (learning rate and ``--clip-grad`` would change meaning
with ``S``) and scales live prompts up by ``N / L``. Nothing in ``d_i`` depends on how the
trajectories split into segments. slime clamps ``d`` at 1; a prompt with ``M_P x N / R < 1``
then weighs ``M_P / gbs`` instead (still split-independent).

Estimators: ``grpo`` and ``reinforce_plus_plus_baseline`` get prompt-equal ``d`` by default;
``gspo`` and ``cispo`` only when ``--dressage-prompt-equal-estimators`` names them
(:mod:`dressage.slime.args`; ``none`` turns it off). Every other estimator, and any not
named, gets slime's default, the rollout's summed mask.

Speed
-----
A batch is thousands of samples of thousands of tokens, millions of Python objects: whatever
walks every token list in Python costs more than the rest of the converter together, and even
one pass over the samples misses the cache on each. So every field is read in one pass
(:func:`~dressage.slime.layout.read_columns`), lengths are checked for every sample (O(1)
each), and per-token work is kept to what the denominators need. A sample written by
:func:`~dressage.rollout.artifacts.samples.write_sample_from_segment` carries its trainable-token
count and had its log-probs checked (``metadata["dressage_written"]``); the count is trusted while
the lengths match, and a spread of up to 16 recorded samples per batch is recounted and
re-checked. Any other sample's mask is counted exactly (packed to bytes at C speed and counted by
numpy, faster than slime's own ``sum``; masks that are not 0/1 ints take ``sum``); its log-probs
are checked on a spread of up to 16 such samples: a full scan reads every log-prob (more memory
than the masks) and would make the cold path slower than slime's default, which checks none,
while a producer that emits bad log-probs does so systematically. Teacher log-probs are checked
for finiteness on every sample (NaN would poison the MOPD advantage), the sign on the spread.
Grouping is numpy over per-sample scalars; token lists are passed by reference, never copied.
Measured against slime's default: ``bench/convert.py``, ``bench/results/convert_cpu.log``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dressage.rollout.artifacts.samples import check_logprobs
from dressage.slime.args import SlimeArgs, slime_args
from dressage.slime.layout import MISSING, BatchLayout, SampleColumns, build_layout, read_columns
from dressage.slime.rewards import post_process_rewards
from dressage.slime.sample_meta import (
    TEACHER_ID,
    cached_loss_mask_sum,
    describe,
    record_loss_mask_sum,
)
from dressage.types import Sample

__all__ = ["SPOT_CHECKS", "convert_samples_to_train_data", "rollout_mask_sums"]

SPOT_CHECKS = 16
"""Samples per batch (of the recorded ones, and of the others) whose per-token facts are
re-checked in full: recorded mask sums recounted, log-probs checked for finite values <= 0."""


def convert_samples_to_train_data(args: Any, samples: list[Sample]) -> dict[str, Any]:
    """slime hook: the flat batch ``samples`` as train_data (one list entry per sample).

    Raises:
        ValueError / TypeError: misaligned lengths, NaN log-probs, missing prompt or session
            ids, rewards of the wrong type, siblings that disagree on their prompt, instance
            or teacher; each message names the sample and the field.
    """
    view = slime_args(args)
    columns = read_columns(samples)
    layout = build_layout(
        samples, need_prompts=view.normalizes_rewards or view.prompt_equal, columns=columns
    )
    masks = _count_masks(samples, columns)
    _spot_check(samples, masks)
    raw, rewards = post_process_rewards(view, samples, layout, columns=columns)
    for i, value in enumerate(columns.raw_reward):
        if value is not MISSING:
            raw[i] = value  # slime: metadata["raw_reward"] wins
    truncated = Sample.Status.TRUNCATED
    sums = np.array(masks.sums, dtype=np.float64)
    data: dict[str, Any] = {
        "tokens": columns.tokens,
        "response_lengths": columns.response_lengths,
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [1 if status == truncated else 0 for status in columns.statuses],
        "sample_indices": columns.indices,
        "rollout_ids": layout.rollout_ids,
        "loss_masks": masks.masks,
        "rollout_mask_sums": rollout_mask_sums(view, layout, sums).tolist(),
    }
    _optional_keys(view, samples, columns, masks, data)
    data["source_names"] = [
        str(name) if name else "unknown"  # slime's get_source: sample.source first
        for name in (a or b for a, b in zip(columns.sources, columns.source_name, strict=True))
    ]
    if view.carries_teacher_ids and any(t is not None for t in columns.teacher_id):
        data["prompt"] = _teacher_ids(samples, columns.teacher_id)
    return data


def rollout_mask_sums(view: SlimeArgs, layout: BatchLayout, mask_sums: np.ndarray) -> np.ndarray:
    """Per-sample loss denominators: prompt-equal ``M_P x N / R`` or slime's rollout sums.

    ``N / R`` is the batch's prompts per rollout (dead prompts included); the module docstring
    relates it to the design's ``M_P x L / gbs``.

    Args:
        mask_sums: (n,) trainable tokens per sample (0 for removed samples).
    """
    per_rollout = np.bincount(
        layout.rollout_index, weights=mask_sums, minlength=layout.num_rollouts
    )
    if not view.prompt_equal:
        return per_rollout[layout.rollout_index]
    assert layout.prompt_index is not None  # build_layout(need_prompts=True) guarantees it
    prompt_of_rollout = layout.prompt_index[layout.anchors]
    tokens = np.bincount(prompt_of_rollout, weights=per_rollout)
    per_prompt = tokens * (len(tokens) / layout.num_rollouts)
    return per_prompt[layout.prompt_index]


@dataclass
class _Masks:
    """Each sample's train-time loss mask and trainable-token count."""

    masks: list[list[int]]
    sums: list[float] = field(default_factory=list)
    recorded: list[int] = field(default_factory=list)
    """Positions whose count came from the write-time record."""
    counted: list[int] = field(default_factory=list)
    """Positions without a usable record: counted here, log-probs not yet checked."""


def _count_masks(samples: Sequence[Sample], columns: SampleColumns) -> _Masks:
    """Check lengths, then count every mask (or take its write-time record).

    A missing mask becomes all ones and is written back to the sample (slime does the same);
    ``remove_sample`` trains nothing (an all-zero mask).
    """
    _check_lengths(samples, columns)
    lengths = columns.response_lengths
    out = _Masks(masks=list(columns.loss_masks))  # type: ignore[arg-type]  # None filled below
    sums, recorded, counted = out.sums, out.recorded, out.counted
    for i, (record, n, mask) in enumerate(zip(columns.written, lengths, out.masks, strict=True)):
        if mask is None:
            out.masks[i] = samples[i].loss_mask = [1] * n
            sums.append(n)
            counted.append(i)
            continue
        count = record_loss_mask_sum(record, n)
        if count is None:
            sums.append(_mask_sum(samples[i], mask))
            counted.append(i)
        else:
            sums.append(count)
            recorded.append(i)
    for i in [i for i, removed in enumerate(columns.removed) if removed]:
        out.masks[i], sums[i] = [0] * lengths[i], 0
    return out


def _check_lengths(samples: Sequence[Sample], columns: SampleColumns) -> None:
    """``0 <= response_length <= len(tokens)``; loss mask and log-probs one entry per position."""
    ok = [
        0 <= n <= len(t) and (m is None or len(m) == n) and (p is None or len(p) == n)
        for n, t, m, p in zip(
            columns.response_lengths,
            columns.tokens,
            columns.loss_masks,
            columns.log_probs,
            strict=True,
        )
    ]
    if not all(ok):
        _raise_misaligned(samples[ok.index(False)])


_frombuffer, _uint8 = np.frombuffer, np.uint8
_max, _count_nonzero = np.maximum.reduce, np.count_nonzero


def _mask_sum(sample: Sample, mask: list[int]) -> float:
    """``sum(mask)``, exactly; a list of 0/1 ints is counted without a Python-level loop.

    ``bytearray(list)`` packs a list of ints in 0..255 at C speed (about 1.5x faster than
    ``sum`` walks it); numpy then counts the nonzero bytes, which is the sum when no byte
    exceeds 1. Any other mask takes slime's own ``sum``.
    """
    if type(mask) is list and mask:
        try:
            packed = _frombuffer(bytearray(mask), _uint8)
        except (TypeError, ValueError):  # not ints in 0..255
            packed = None
        if packed is not None and _max(packed) <= 1:
            return int(_count_nonzero(packed))
    try:
        return sum(mask)
    except TypeError:
        raise TypeError(
            f"{describe(sample)} field=loss_mask: entries must be numbers (0 or 1)"
        ) from None


def _raise_misaligned(sample: Sample) -> None:
    n = sample.response_length
    if not 0 <= n <= len(sample.tokens):
        raise ValueError(
            f"{describe(sample)} field=response_length: {n} with {len(sample.tokens)} tokens"
        )
    for name in ("loss_mask", "rollout_log_probs"):
        values = getattr(sample, name)
        if values is not None and len(values) != n:
            raise ValueError(
                f"{describe(sample)} field={name}: {len(values)} entries but response_length={n}"
            )


def _spread(positions: list[int]) -> list[int]:
    """Up to SPOT_CHECKS of ``positions``, evenly spread (first and last included)."""
    if len(positions) <= SPOT_CHECKS:
        return positions
    picks = np.unique(np.linspace(0, len(positions) - 1, SPOT_CHECKS).astype(np.int64))
    return [positions[int(k)] for k in picks]


def _spot_check(samples: Sequence[Sample], masks: _Masks) -> None:
    """Re-check the per-token facts of a spread of samples: catches systematic faults.

    Recorded samples: the mask sum is recounted (a stale record) and the log-probs checked.
    The others: their masks were counted in full; their log-probs are checked here.
    """
    for i in _spread(masks.recorded):
        sample = samples[i]
        assert sample.loss_mask is not None  # only samples with a mask are recorded
        recorded, actual = cached_loss_mask_sum(sample), _mask_sum(sample, sample.loss_mask)
        if recorded != actual:
            raise ValueError(
                f"{describe(sample)} field=metadata.dressage_written: records {recorded} "
                f"trainable tokens but loss_mask sums to {actual}; code that edits a loss mask "
                "must call dressage.slime.sample_meta.record_written"
            )
    for i in [*_spread(masks.recorded), *_spread(masks.counted)]:
        logprobs = samples[i].rollout_log_probs
        if logprobs is not None:
            check_logprobs(logprobs, f"{describe(samples[i])} field=rollout_log_probs")


def _optional_keys(
    view: SlimeArgs,
    samples: Sequence[Sample],
    columns: SampleColumns,
    masks: _Masks,
    data: dict[str, Any],
) -> None:
    """Keys slime emits only when the first sample (or any, where noted) has them (§3.2)."""
    first = samples[0]
    if "round_number" in first.metadata:
        data["round_number"] = [meta["round_number"] for meta in columns.metadata]
    if first.rollout_log_probs is not None:  # lengths were checked by _check_lengths
        data["rollout_log_probs"] = _fill_missing(samples, columns.log_probs, masks, "rollout")
    if view.rollout_top_p != 1.0:
        data["rollout_top_p_token_ids"] = [s.rollout_top_p_token_ids for s in samples]
        data["rollout_top_p_token_offsets"] = [_top_p_offsets(s) for s in samples]
    if first.rollout_routed_experts is not None:
        data["rollout_routed_experts"] = [s.rollout_routed_experts for s in samples]
    if first.train_metadata is not None:
        data["metadata"] = [s.train_metadata for s in samples]
    if any(m is not None for m in columns.multimodal):
        data["multimodal_train_inputs"] = columns.multimodal
    if first.teacher_log_probs is not None:
        data["teacher_log_probs"] = _checked_teacher_log_probs(samples, masks)


def _checked_teacher_log_probs(samples: Sequence[Sample], masks: _Masks) -> list[Any]:
    """Every sample's teacher log-probs: lengths and finiteness on all, the sign on a spread.

    A NaN or inf would poison the MOPD advantage of its whole step, so every list is summed
    (one C-speed pass); a positive value can only come from a systematic fault in the scoring.
    """
    values = [s.teacher_log_probs for s in samples]
    teacher = _fill_missing(samples, values, masks, "teacher")
    for sample, logprobs in zip(samples, teacher, strict=True):
        n, where = sample.response_length, f"{describe(sample)} field=teacher_log_probs"
        if len(logprobs) != n:
            raise ValueError(f"{where}: {len(logprobs)} entries but response_length={n}")
        if not math.isfinite(sum(logprobs)):
            _raise_not_finite(logprobs, where)
    for i in _spread(list(range(len(samples)))):
        check_logprobs(teacher[i], f"{describe(samples[i])} field=teacher_log_probs")
    return teacher


def _raise_not_finite(values: Sequence[float], where: str) -> None:
    """Name the first NaN or inf (a sum of finite values can overflow: then nothing is raised)."""
    for i, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(f"{where}[{i}]={value!r}: log-probs must be finite and <= 0")


def _fill_missing(
    samples: Sequence[Sample], values: list[Any], masks: _Masks, kind: str
) -> list[Any]:
    """``{kind}_log_probs`` of every sample; one that trains nothing may lack them (zeros)."""
    if None not in values:
        return values
    out = list(values)
    for i, sample in enumerate(samples):
        if out[i] is None:
            if masks.sums[i] != 0:
                raise ValueError(
                    f"{describe(sample)} field={kind}_log_probs: missing, but the first sample "
                    "has them"
                )
            out[i] = [0.0] * sample.response_length
    return out


def _top_p_offsets(sample: Sample) -> Any:
    offsets = sample.rollout_top_p_token_offsets
    n = sample.response_length
    if offsets is None or len(offsets) != n + 1 or int(offsets[0]) != 0:
        size = None if offsets is None else len(offsets)
        raise ValueError(
            f"{describe(sample)} field=rollout_top_p_token_offsets: need {n + 1} entries "
            f"starting at 0, got {size}"
        )
    return offsets


def _teacher_ids(samples: Sequence[Sample], teachers: list[Any]) -> list[str]:
    """The ``prompt`` slot: every sample's teacher id (all must have one when any has)."""
    for sample, teacher in zip(samples, teachers, strict=True):
        if teacher is None or (isinstance(teacher, float) and math.isnan(teacher)):
            raise ValueError(
                f"{describe(sample)} field=metadata.{TEACHER_ID}: missing while other samples "
                "name their teacher; every sample must be scored by its dataset's teacher"
            )
    return [str(t) for t in teachers]
