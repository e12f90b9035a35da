"""How a flat batch of samples groups into rollouts (trajectories), anchors and prompts.

slime flattens every rollout's samples into one list before conversion (reference/slime.md
§3.1). Siblings (the segments of one trajectory) share a ``rollout_id``; a ``None`` id gets a
fresh small integer not used by any other sample, as slime's converter does (§3.2), so such a
sample is a rollout of its own. Each rollout has exactly one anchor: the sample whose
``metadata["segment_index"]`` is ``num_segments - 1``, or the only sample of a rollout that
carries no segment metadata (a plain slime sample). The prompt of a sample is its
``group_index`` (the data source sets one per prompt), else ``metadata["instance_id"]``.

:func:`build_layout` checks all of this once per batch and fails before training, naming the
sample and the field, when siblings disagree on their prompt, session, instance or teacher.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.rollout.sample_meta import (
    INSTANCE_ID,
    NUM_SEGMENTS,
    PARENT_TRAJ_ID,
    SEGMENT_INDEX,
    TEACHER_ID,
    describe,
)
from dressage.types import Sample

__all__ = ["BatchLayout", "build_layout", "resolve_rollout_ids"]

# metadata fields every sibling must share with its anchor
_SHARED_METADATA = (PARENT_TRAJ_ID, INSTANCE_ID, TEACHER_ID)


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


_NO_FLAG, _NOT_ANCHOR, _ANCHOR = -1, 0, 1


def build_layout(samples: Sequence[Sample], *, need_prompts: bool) -> BatchLayout:
    """Group ``samples`` into rollouts and prompts; raise ValueError on inconsistent siblings.

    One pass over the samples gathers what grouping needs; the checks are numpy over codes.

    Args:
        need_prompts: every sample must name its prompt (``group_index`` or
            ``metadata["instance_id"]``); set for group normalisation and prompt-equal weights.
    """
    if not samples:
        raise ValueError("the batch has no samples")
    ids: list[int | None] = []
    flags: list[int] = []
    prompts: list[Hashable | None] = []
    shared: list[tuple[Any, ...]] = []
    for sample in samples:
        meta = sample.metadata
        ids.append(sample.rollout_id)
        segment, count = meta.get(SEGMENT_INDEX), meta.get(NUM_SEGMENTS)
        flags.append(_NO_FLAG if segment is None or count is None else int(segment == count - 1))
        group = sample.group_index
        # an int group index and a tagged instance id can never be equal
        prompts.append(int(group) if group is not None else _instance_key(meta))
        shared.append((meta.get(PARENT_TRAJ_ID), meta.get(INSTANCE_ID), meta.get(TEACHER_ID)))
    rollout_ids = _fill_fresh(ids)
    dense: dict[int, int] = {}
    rollout_index = np.array([dense.setdefault(r, len(dense)) for r in rollout_ids], np.int64)
    flag_array = np.array(flags, dtype=np.int8)
    anchors = _find_anchors(samples, rollout_ids, rollout_index, flag_array, len(dense))
    _check_sessions(samples, flags, shared)
    owner = anchors[rollout_index]  # each sample's anchor
    _check_siblings(samples, owner, prompts, ("group_index",))
    _check_siblings(samples, owner, shared, tuple(f"metadata.{n}" for n in _SHARED_METADATA))
    return BatchLayout(
        rollout_ids, rollout_index, anchors, _dense_prompts(samples, prompts, need_prompts)
    )


def _instance_key(meta: dict[str, Any]) -> Hashable | None:
    instance = meta.get(INSTANCE_ID)
    return None if instance is None else ("instance_id", str(instance))


def _find_anchors(
    samples: Sequence[Sample],
    rollout_ids: list[int],
    rollout_index: np.ndarray,
    flags: np.ndarray,
    count: int,
) -> np.ndarray:
    sizes = np.bincount(rollout_index, minlength=count)[rollout_index]
    unflagged = np.flatnonzero((flags == _NO_FLAG) & (sizes > 1))
    if unflagged.size:
        i = int(unflagged[0])
        raise ValueError(
            f"{describe(samples[i])} field=metadata.{SEGMENT_INDEX}: rollout_id {rollout_ids[i]} "
            f"has {sizes[i]} samples, so each needs segment_index and num_segments"
        )
    candidates = np.flatnonzero(flags != _NOT_ANCHOR)
    per_rollout = np.bincount(rollout_index[candidates], minlength=count)
    bad = np.flatnonzero(per_rollout != 1)
    if bad.size:
        i = int(np.flatnonzero(rollout_index == bad[0])[0])
        found = int(per_rollout[bad[0]])
        raise ValueError(
            f"{describe(samples[i])} field=metadata.{NUM_SEGMENTS}: rollout_id {rollout_ids[i]} "
            f"has {found} anchors (samples with segment_index == num_segments - 1), not 1"
        )
    anchors = np.empty(count, dtype=np.int64)
    anchors[rollout_index[candidates]] = candidates
    return anchors


def _check_sessions(
    samples: Sequence[Sample], flags: list[int], shared: list[tuple[Any, ...]]
) -> None:
    for i, (flag, fields) in enumerate(zip(flags, shared, strict=True)):
        if flag != _NO_FLAG and not fields[0]:
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
    samples: Sequence[Sample], owner: np.ndarray, values: list[Any], fields: tuple[str, ...]
) -> None:
    """Every sample agrees with its anchor on ``values`` (a tuple of ``fields`` when several)."""
    codes = _codes(values)
    differ = np.flatnonzero(codes != codes[owner])
    if not differ.size:
        return
    i = int(differ[0])
    a = int(owner[i])
    mine, theirs = values[i], values[a]
    if len(fields) > 1:
        k = next(k for k in range(len(fields)) if mine[k] != theirs[k])
        field, mine, theirs = fields[k], mine[k], theirs[k]
    else:
        field = fields[0]
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
