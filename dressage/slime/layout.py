"""How a flat batch of samples groups into rollouts (trajectories), anchors and prompts.

slime flattens every rollout's samples into one list before conversion (docs/slime.md
§3.1). Siblings share a ``rollout_id``; a ``None`` id gets a fresh small integer not used by any
other sample, as slime's converter does (§3.2), so such a sample is a rollout of its own. The
prompt of a sample is its ``group_index`` (the data source sets one per prompt), else
``metadata["instance_id"]``.

Segment samples and plain samples
---------------------------------
A *segment sample* carries both ``metadata["segment_index"]`` and ``metadata["num_segments"]``
(dressage writes them together with ``parent_traj_id`` in
:func:`~dressage.rollout.multi_segment.expand_segments_to_samples` and ``mark_aborted_no_grad``,
never one without the other). Its rollout's anchor is the sibling with ``segment_index ==
num_segments - 1``, exactly one per rollout, and it must name its session (``parent_traj_id``).

Any other sample is a *plain* slime sample, whatever else its metadata holds: no segment keys,
keys under other names, or a ``parent_traj_id`` (or ``segment_index``) without
``num_segments``. slime's own multi-sample producers (``slime/agent/trajectory.py``'s
``get_trajectory``, the compact/fan-out rollouts) tie siblings by ``rollout_id`` alone, put no
segment index or count in metadata, and give every sibling the trajectory's whole reward. So
plain samples are grouped by ``rollout_id`` only; a plain rollout of several samples is one
trajectory whose anchor is its **last sample in batch order** (its reward is the rollout's,
as every sibling carries the same one); ``parent_traj_id`` on a plain sample is a label, not a
key (a subagent's samples may name another session). A rollout may not mix segment samples
with plain ones: that is a writer that lost keys, and it fails naming the sample.

:func:`build_layout` checks all of this once per batch and fails before training, naming the
sample and the field, when siblings disagree on their prompt, instance or teacher (segment
siblings also on their session).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.slime.sample_meta import (
    INSTANCE_ID,
    NUM_SEGMENTS,
    PARENT_TRAJ_ID,
    SEGMENT_INDEX,
    SOURCE_NAME,
    TEACHER_ID,
    WRITTEN,
    describe,
)
from dressage.types import Sample

__all__ = [
    "MISSING",
    "BatchLayout",
    "SampleColumns",
    "build_layout",
    "read_columns",
    "resolve_rollout_ids",
]

MISSING: Any = object()
"""``SampleColumns.raw_reward`` entry of a sample whose metadata has no ``raw_reward``."""


@dataclass(frozen=True)
class BatchLayout:
    """Index arrays over a batch of ``n`` samples, ``R`` rollouts and ``P`` prompts.

    Attributes:
        rollout_ids: (n,) the rollout id of each sample, ``None`` ids resolved as slime does.
        rollout_index: (n,) int64, dense rollout number 0..R-1 in first-occurrence order.
        anchors: (R,) int64, position of each rollout's anchor sample.
        prompt_index: (n,) int64, dense prompt number 0..P-1, or None when prompts were not
            required and some sample has none.
    """

    rollout_ids: list[int]
    rollout_index: np.ndarray
    anchors: np.ndarray
    prompt_index: np.ndarray | None

    @property
    def num_rollouts(self) -> int:
        return int(self.anchors.size)

    @property
    def is_anchor(self) -> np.ndarray:
        flags = np.zeros(self.rollout_index.size, dtype=bool)
        flags[self.anchors] = True
        return flags


@dataclass(frozen=True)
class SampleColumns:
    """The per-sample fields that grouping and conversion read, one list entry per sample.

    A rollout batch holds millions of objects, so each pass over its samples misses the cache
    on every sample and costs about as much as reading a field (0.5-1 us a sample, a few ms
    a pass at 4,096 samples on a 2-core machine): :func:`read_columns` reads every field in
    one pass, and the rest works on these lists. Field order is the order of ``_row``.
    """

    rollout_ids: list[int | None]
    group_indices: list[int | None]
    indices: list[int | None]
    response_lengths: list[int]
    tokens: list[list[int]]
    loss_masks: list[list[int] | None]
    log_probs: list[list[float] | None]
    statuses: list[Any]
    removed: list[bool]
    rewards: list[Any]
    multimodal: list[Any]
    sources: list[Any]
    """``sample.source`` where a producer set one (slime's get_source reads it first)."""
    metadata: list[dict[str, Any]]
    segment_index: list[Any]
    num_segments: list[Any]
    parent_traj_id: list[Any]
    instance_id: list[Any]
    teacher_id: list[Any]
    source_name: list[Any]
    written: list[Any]
    raw_reward: list[Any]
    """``metadata["raw_reward"]``, or :data:`MISSING`."""


def _row(sample: Sample) -> tuple[Any, ...]:
    meta = sample.metadata
    return (
        sample.rollout_id,
        sample.group_index,
        sample.index,
        sample.response_length,
        sample.tokens,
        sample.loss_mask,
        sample.rollout_log_probs,
        sample.status,
        sample.remove_sample,
        sample.reward,
        sample.multimodal_train_inputs,
        getattr(sample, "source", None),
        meta,
        meta.get(SEGMENT_INDEX),
        meta.get(NUM_SEGMENTS),
        meta.get(PARENT_TRAJ_ID),
        meta.get(INSTANCE_ID),
        meta.get(TEACHER_ID),
        meta.get(SOURCE_NAME),
        meta.get(WRITTEN),
        meta.get("raw_reward", MISSING),
    )


def read_columns(samples: Sequence[Sample]) -> SampleColumns:
    """Every field :class:`SampleColumns` lists, in one pass over ``samples``."""
    if not samples:
        raise ValueError("the batch has no samples")
    return SampleColumns(*[list(column) for column in zip(*map(_row, samples), strict=True)])


def resolve_rollout_ids(samples: Sequence[Sample]) -> list[int]:
    """Each sample's ``rollout_id``; a ``None`` gets the smallest integer no sample uses yet."""
    return _fill_fresh([s.rollout_id for s in samples])


def _fill_fresh(ids: list[int | None]) -> list[int]:
    if None not in ids:
        return [int(r) for r in ids]  # type: ignore[arg-type]
    used = {int(r) for r in ids if r is not None}
    out: list[int] = []
    fresh = 0
    for rollout_id in ids:
        if rollout_id is not None:
            out.append(int(rollout_id))
            continue
        while fresh in used:
            fresh += 1
        used.add(fresh)
        out.append(fresh)
    return out


_PLAIN, _NOT_ANCHOR, _ANCHOR = -1, 0, 1


def build_layout(
    samples: Sequence[Sample], *, need_prompts: bool, columns: SampleColumns | None = None
) -> BatchLayout:
    """Group ``samples`` into rollouts and prompts; raise ValueError on inconsistent siblings.

    Anchors are found with numpy over per-sample flags; siblings are compared with their anchor
    only in rollouts of several samples.

    Args:
        need_prompts: every sample must name its prompt (``group_index`` or
            ``metadata["instance_id"]``); set for group normalisation and prompt-equal weights.
        columns: ``read_columns(samples)`` when the caller has it already (one pass fewer).
    """
    if columns is None:
        columns = read_columns(samples)
    flags = [
        _PLAIN if segment is None or count is None else int(segment == count - 1)
        for segment, count in zip(columns.segment_index, columns.num_segments, strict=True)
    ]
    # an int group index and a tagged instance id can never be equal
    prompts: list[Hashable | None] = [
        (None if instance is None else ("instance_id", str(instance))) if g is None else int(g)
        for g, instance in zip(columns.group_indices, columns.instance_id, strict=True)
    ]
    rollout_ids = _fill_fresh(columns.rollout_ids)
    dense: dict[int, int] = {}
    rollout_index = np.array([dense.setdefault(r, len(dense)) for r in rollout_ids], np.int64)
    anchors = _find_anchors(samples, rollout_ids, rollout_index, np.array(flags, np.int8))
    _check_sessions(samples, columns.parent_traj_id, flags)
    owner = anchors[rollout_index]  # each sample's anchor
    siblings = np.flatnonzero(owner != np.arange(owner.size)).tolist()
    if siblings:
        # a plain sample's parent_traj_id is a label, not a key: only segments must share it
        sessions = [
            None if f == _PLAIN else v for f, v in zip(flags, columns.parent_traj_id, strict=True)
        ]
        for values, field in (
            (prompts, "group_index"),
            (sessions, f"metadata.{PARENT_TRAJ_ID}"),
            (columns.instance_id, f"metadata.{INSTANCE_ID}"),
            (columns.teacher_id, f"metadata.{TEACHER_ID}"),
        ):
            _check_siblings(samples, owner, siblings, values, field)
    return BatchLayout(
        rollout_ids, rollout_index, anchors, _dense_prompts(samples, prompts, need_prompts)
    )


def _find_anchors(
    samples: Sequence[Sample],
    rollout_ids: list[int],
    rollout_index: np.ndarray,
    flags: np.ndarray,
) -> np.ndarray:
    """(R,) the anchor of each rollout: the flagged segment, or a plain rollout's last sample."""
    count = int(rollout_index.max()) + 1
    plain = flags == _PLAIN
    sizes = np.bincount(rollout_index, minlength=count)
    plain_per_rollout = np.bincount(rollout_index, weights=plain, minlength=count)
    all_plain = plain_per_rollout == sizes
    mixed = np.flatnonzero(plain & ~all_plain[rollout_index])
    if mixed.size:
        i = int(mixed[0])
        meta = samples[i].metadata
        missing = SEGMENT_INDEX if meta.get(SEGMENT_INDEX) is None else NUM_SEGMENTS
        raise ValueError(
            f"{describe(samples[i])} field=metadata.{missing}: rollout_id {rollout_ids[i]} "
            "mixes segment samples (segment_index and num_segments) with this sample, which "
            "lacks them; a writer lost keys"
        )
    last = np.full(count, -1, dtype=np.int64)  # each rollout's last position in the batch
    np.maximum.at(last, rollout_index, np.arange(rollout_index.size, dtype=np.int64))
    candidates = np.flatnonzero(flags == _ANCHOR)
    per_rollout = np.bincount(rollout_index[candidates], minlength=count)
    bad = np.flatnonzero((per_rollout != 1) & ~all_plain)
    if bad.size:
        i = int(np.flatnonzero(rollout_index == bad[0])[0])
        found = int(per_rollout[bad[0]])
        raise ValueError(
            f"{describe(samples[i])} field=metadata.{NUM_SEGMENTS}: rollout_id {rollout_ids[i]} "
            f"has {found} anchors (samples with segment_index == num_segments - 1), not 1"
        )
    anchors = last
    anchors[rollout_index[candidates]] = candidates
    return anchors


def _check_sessions(samples: Sequence[Sample], sessions: list[Any], flags: list[int]) -> None:
    for i, (session, flag) in enumerate(zip(sessions, flags, strict=True)):
        if flag != _PLAIN and not session:
            raise ValueError(
                f"{describe(samples[i])} field=metadata.{PARENT_TRAJ_ID}: a segment sample "
                "must name its session"
            )


def _codes(values: list[Any]) -> np.ndarray:
    """Dense integer codes of hashable values (unhashable ones are coded by their repr)."""
    table: dict[Any, int] = {}
    try:
        codes = [table.setdefault(value, len(table)) for value in values]
    except TypeError:
        table.clear()
        codes = [table.setdefault(_hashable(value), len(table)) for value in values]
    return np.array(codes, dtype=np.int64)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _check_siblings(
    samples: Sequence[Sample],
    owner: np.ndarray,
    siblings: list[int],
    values: list[Any],
    field: str,
) -> None:
    """Every non-anchor sibling agrees with its anchor on ``values`` (one entry per sample)."""
    owners = owner[siblings].tolist()
    for i, a in zip(siblings, owners, strict=True):
        mine, theirs = values[i], values[a]
        if mine is not theirs and mine != theirs:
            raise ValueError(
                f"{describe(samples[i])} field={field}: {mine!r} but its anchor "
                f"{describe(samples[a])} has {theirs!r}; siblings must agree"
            )


def _dense_prompts(
    samples: Sequence[Sample], keys: list[Hashable | None], need_prompts: bool
) -> np.ndarray | None:
    missing = [i for i, key in enumerate(keys) if key is None]
    if missing:
        if not need_prompts:
            return None
        raise ValueError(
            f"{describe(samples[missing[0]])} field=group_index: the sample names no prompt "
            f"(group_index and metadata.{INSTANCE_ID} are both missing)"
        )
    return _codes(keys)
