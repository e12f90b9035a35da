"""Samples to slime train_data with prompt-equal loss weights (a slime converter hook).

    --custom-convert-samples-to-train-data-path \\
        dressage.rollout.convert_samples.convert_samples_to_train_data

This replaces slime's whole default converter, reward post-processing included (reference/
slime.md §2, §3.2), so it calls :func:`~dressage.training.reward_post_process` itself and emits
every key slime's default emits, in its order, plus ``prompt`` (the per-sample ``teacher_id``
when any sample has one; slime forwards that slot to the trainer untouched, §3.3).

Prompt-equal weights
--------------------
slime's reducer (§3.4) turns a step's loss into ``(1/G) sum_i sum_t x_it m_it / max(d_i, 1)``
where ``i`` runs over the step's samples, ``m`` is the loss mask, ``d_i`` the sample's
``rollout_mask_sums`` entry and ``G = global_batch_size`` (rollouts per step). So token ``t``
of sample ``i`` weighs ``m_it / (G max(d_i, 1))``. slime's own ``d_i`` (the rollout's summed
mask) makes every rollout one token mean of weight ``1/G``, so a prompt whose trajectories split
into several samples would count as often as it has samples in a naive per-sample mean. Prompt-
equal weights make every prompt of a step count once, as one token mean over all its trainable
tokens, whichever trajectory or segment they are in.

For a prompt ``P`` let ``M_P`` be its trainable tokens over all its trajectories and segments
(removed samples count 0), ``N_P`` the number of prompts in the step and ``gbs`` the rollouts
per step. Every sample of ``P`` gets

    d_i = M_P x N_P / gbs

Then P's total weight is ``sum_i sum_t m_it / (G d_i) = M_P / (G M_P N_P / gbs) = 1 / N_P``
(with ``G = gbs``): each prompt weighs the same, a step sums to 1 exactly as slime's default
does (so learning rates and ``--clip-grad`` keep their meaning), every token of ``P`` weighs
``1 / (M_P N_P)``, and nothing in ``d_i`` depends on how the trajectories split into segments.
``N_P / gbs`` is the batch's prompts per rollout (``1 / n_samples_per_prompt`` when every
prompt has its ``n`` trajectories), so ``d_i = M_P x prompts / rollouts`` whatever the number
of steps per rollout. slime clamps ``d`` at 1; a prompt with fewer trainable tokens than
trajectories then weighs ``M_P / gbs`` instead of ``1 / N_P`` (still split-independent).

Estimators: grpo, gspo, cispo and reinforce_plus_plus_baseline get prompt-equal ``d``.
``ppo``, ``reinforce_plus_plus`` (and any other) get slime's default, the rollout's summed
mask, because their per-token returns are built per sample, not per prompt group.

Speed: the per-sample trainable-token count and the log-prob check are done once when a
sample is written (:func:`~dressage.rollout.artifacts.samples.write_sample_from_segment`
records them in ``metadata["dressage_written"]``); here they are trusted while the lengths
still match, re-checked on a spread of up to 16 samples per batch, and computed for samples
without a record. Grouping is numpy over per-sample scalars; token lists are passed by
reference, never copied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dressage.rollout.artifacts.samples import check_logprobs
from dressage.rollout.layout import BatchLayout, build_layout
from dressage.rollout.sample_meta import (
    SOURCE_NAME,
    TEACHER_ID,
    cached_loss_mask_sum,
    describe,
    recorded_loss_mask_sum,
)
from dressage.rollout.slime_args import SlimeArgs, slime_args
from dressage.training.reward_post_process import post_process_rewards
from dressage.types import Sample

__all__ = ["SPOT_CHECKS", "convert_samples_to_train_data", "rollout_mask_sums"]

SPOT_CHECKS = 16
"""Samples per batch whose recorded mask sum and log-probs are recomputed and compared."""


def convert_samples_to_train_data(args: Any, samples: list[Sample]) -> dict[str, Any]:
    """slime hook: the flat batch ``samples`` as train_data (one list entry per sample).

    Raises:
        ValueError / TypeError: misaligned lengths, NaN log-probs, missing prompt or session
            ids, rewards of the wrong type, siblings that disagree on their prompt, instance
            or teacher; each message names the sample and the field.
    """
    view = slime_args(args)
    layout = build_layout(samples, need_prompts=view.normalizes_rewards or view.prompt_equal)
    columns = _scan(samples)
    _spot_check(samples, columns.recorded)
    mask_sums = np.array(columns.mask_sums, dtype=np.float64)
    raw, rewards = post_process_rewards(view, samples, layout)
    for i, value in columns.raw_overrides.items():  # slime: metadata["raw_reward"] wins
        raw[i] = value
    data: dict[str, Any] = {
        "tokens": columns.tokens,
        "response_lengths": columns.response_lengths,
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": columns.truncated,
        "sample_indices": columns.sample_indices,
        "rollout_ids": layout.rollout_ids,
        "loss_masks": columns.loss_masks,
        "rollout_mask_sums": rollout_mask_sums(view, layout, mask_sums).tolist(),
    }
    _optional_keys(view, samples, columns, data)
    data["source_names"] = columns.source_names
    if any(t is not None for t in columns.teachers):
        data["prompt"] = _teacher_ids(samples, columns.teachers)
    return data


def rollout_mask_sums(view: SlimeArgs, layout: BatchLayout, mask_sums: np.ndarray) -> np.ndarray:
    """Per-sample loss denominators: prompt-equal ``M_P x N_P / gbs`` or slime's rollout sums.

    ``N_P / gbs`` (prompts per step over rollouts per step) is the batch's prompts per rollout.

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
class _Columns:
    """Per-sample values gathered in one pass over the batch."""

    tokens: list[list[int]] = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)
    truncated: list[int] = field(default_factory=list)
    sample_indices: list[int | None] = field(default_factory=list)
    loss_masks: list[list[int]] = field(default_factory=list)
    mask_sums: list[int] = field(default_factory=list)
    source_names: list[str] = field(default_factory=list)
    teachers: list[Any] = field(default_factory=list)
    log_probs: list[list[float] | None] = field(default_factory=list)
    raw_overrides: dict[int, Any] = field(default_factory=dict)
    recorded: list[int] = field(default_factory=list)
    """Positions whose mask sum came from the write-time record."""


def _scan(samples: Sequence[Sample]) -> _Columns:
    """Check lengths and gather the per-sample keys.

    A missing mask becomes all ones and is written back to the sample (slime does the same);
    ``remove_sample`` trains nothing (an all-zero mask).
    """
    out = _Columns()
    truncated = Sample.Status.TRUNCATED
    for i, sample in enumerate(samples):
        n, tokens, mask = sample.response_length, sample.tokens, sample.loss_mask
        logprobs, meta = sample.rollout_log_probs, sample.metadata
        if (
            not 0 <= n <= len(tokens)
            or (mask is not None and len(mask) != n)
            or (logprobs is not None and len(logprobs) != n)
        ):
            _raise_misaligned(sample)
        count = None if mask is None else recorded_loss_mask_sum(meta, n)
        if count is not None:
            out.recorded.append(i)
        else:
            mask, count = _count_unrecorded(sample)
        if sample.remove_sample:
            mask, count = [0] * n, 0
        out.tokens.append(tokens)
        out.response_lengths.append(n)
        out.truncated.append(1 if sample.status == truncated else 0)
        out.sample_indices.append(sample.index)
        out.loss_masks.append(mask)
        out.mask_sums.append(count)
        out.source_names.append(_source_name(sample, meta))
        out.teachers.append(meta.get(TEACHER_ID))
        out.log_probs.append(logprobs)
        if "raw_reward" in meta:
            out.raw_overrides[i] = meta["raw_reward"]
    return out


def _count_unrecorded(sample: Sample) -> tuple[list[int], int]:
    """Mask and trainable-token count of a sample not written by dressage (checked here)."""
    n = sample.response_length
    if sample.loss_mask is None:
        sample.loss_mask = [1] * n
        return sample.loss_mask, n
    if sample.rollout_log_probs is not None:
        check_logprobs(sample.rollout_log_probs, f"{describe(sample)} field=rollout_log_probs")
    return sample.loss_mask, sum(sample.loss_mask)


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


def _spot_check(samples: Sequence[Sample], positions: list[int]) -> None:
    """Recompute the recorded facts of a spread of samples: catches systematic staleness."""
    if not positions:
        return
    picks = np.unique(np.linspace(0, len(positions) - 1, SPOT_CHECKS).astype(np.int64))
    for k in picks:
        sample = samples[positions[int(k)]]
        assert sample.loss_mask is not None
        recorded, actual = cached_loss_mask_sum(sample), sum(sample.loss_mask)
        if recorded != actual:
            raise ValueError(
                f"{describe(sample)} field=metadata.dressage_written: records {recorded} "
                f"trainable tokens but loss_mask sums to {actual}; code that edits a loss mask "
                "must call dressage.rollout.sample_meta.record_written"
            )
        if sample.rollout_log_probs is not None:
            check_logprobs(sample.rollout_log_probs, f"{describe(sample)} field=rollout_log_probs")


def _optional_keys(
    view: SlimeArgs, samples: Sequence[Sample], columns: _Columns, data: dict[str, Any]
) -> None:
    """Keys slime emits only when the first sample (or any, where noted) has them (§3.2)."""
    first = samples[0]
    if "round_number" in first.metadata:
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    if first.rollout_log_probs is not None:  # lengths were checked by _scan
        data["rollout_log_probs"] = _fill_missing(samples, columns, "rollout_log_probs")
    if view.rollout_top_p != 1.0:
        data["rollout_top_p_token_ids"] = [s.rollout_top_p_token_ids for s in samples]
        data["rollout_top_p_token_offsets"] = [_top_p_offsets(s) for s in samples]
    if first.rollout_routed_experts is not None:
        data["rollout_routed_experts"] = [s.rollout_routed_experts for s in samples]
    if first.train_metadata is not None:
        data["metadata"] = [s.train_metadata for s in samples]
    if any(s.multimodal_train_inputs is not None for s in samples):
        data["multimodal_train_inputs"] = [s.multimodal_train_inputs for s in samples]
    if first.teacher_log_probs is not None:
        teacher = _fill_missing(samples, columns, "teacher_log_probs")
        for sample, values in zip(samples, teacher, strict=True):
            n, where = sample.response_length, f"{describe(sample)} field=teacher_log_probs"
            if len(values) != n:
                raise ValueError(f"{where}: {len(values)} entries but response_length={n}")
            check_logprobs(values, where)
        data["teacher_log_probs"] = teacher


def _fill_missing(samples: Sequence[Sample], columns: _Columns, name: str) -> list[Any]:
    """``name`` of every sample; one that trains nothing may lack it (zeros stand in)."""
    values = (
        columns.log_probs if name == "rollout_log_probs" else [getattr(s, name) for s in samples]
    )
    if None not in values:
        return values
    out = list(values)
    for i, sample in enumerate(samples):
        if out[i] is None:
            if columns.mask_sums[i] != 0:
                raise ValueError(
                    f"{describe(sample)} field={name}: missing, but the first sample has it"
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


def _source_name(sample: Sample, meta: dict[str, Any]) -> str:
    name = meta.get(SOURCE_NAME) or getattr(sample, "source", None)
    return str(name) if name else "unknown"


def _teacher_ids(samples: Sequence[Sample], teachers: list[Any]) -> list[str]:
    """The ``prompt`` slot: every sample's teacher id (all must have one when any has)."""
    for sample, teacher in zip(samples, teachers, strict=True):
        if teacher is None or (isinstance(teacher, float) and math.isnan(teacher)):
            raise ValueError(
                f"{describe(sample)} field=metadata.{TEACHER_ID}: missing while other samples "
                "name their teacher; every sample must be scored by its dataset's teacher"
            )
    return [str(t) for t in teachers]
