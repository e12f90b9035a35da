"""The ``Sample.metadata`` vocabulary that dressage writes and reads, in one place.

slime leaves the keys it does not know in ``metadata`` alone (docs/slime.md §1.1: it writes
``start_rollout_id`` under ``--partial-rollout`` and reads ``raw_reward``, ``round_number``,
``source_name`` and ``rm_type``), so it is where a sample carries what slime has no field
for: which trajectory and prompt it belongs to, which segment it is, and facts computed once
when the sample was written from its segment (its trainable-token count) so that the converter
does not recompute them per batch.

Keys::

    parent_traj_id      session id of the trajectory the segment came from
    segment_index       0-based position of the segment in its trajectory
    num_segments        segments in the trajectory; the last one is the anchor
    instance_id         the prompt (one dataset row); siblings must agree
    teacher_id          MOPD teacher that scores this sample (from its dataset)
    agent_mode          "blackbox" or "whitebox" (from its dataset)
    dataset             dataset name; also written as slime's ``source_name``
    truncated           the token cap cut this sample
    no_grad_reason      set by mark_aborted_no_grad: why the trajectory trains nothing
    dressage_written    facts checked when written: loss_mask_sum, response_length

and the weight-version facts of a response, from :func:`version_metadata` (the sample writer
puts them in ``metadata``; the proxy's store puts ``version_spans`` in a segment's
``extra_info``)::

    version_spans                   [version, start, end) runs of generated tokens
    dressage_partial_rollout        the response spans more than one weight version
    dressage_start_token_version    version of its first generated token
    dressage_end_token_version      version of its last generated token
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dressage.trajectory import NO_VERSION
from dressage.types import Sample

__all__ = [
    "AGENT_MODE",
    "DATASET",
    "INSTANCE_ID",
    "NO_GRAD_REASON",
    "NUM_SEGMENTS",
    "PARENT_TRAJ_ID",
    "SEGMENT_INDEX",
    "SOURCE_NAME",
    "TASK",
    "TEACHER_ID",
    "TRUNCATED",
    "WRITTEN",
    "cached_loss_mask_sum",
    "describe",
    "record_loss_mask_sum",
    "record_written",
    "recorded_loss_mask_sum",
    "version_metadata",
]

PARENT_TRAJ_ID = "parent_traj_id"
SEGMENT_INDEX = "segment_index"
NUM_SEGMENTS = "num_segments"
INSTANCE_ID = "instance_id"
TEACHER_ID = "teacher_id"
AGENT_MODE = "agent_mode"
DATASET = "dataset"
SOURCE_NAME = "source_name"  # slime's own key for per-source metrics (reference §3.2 item 14)
TASK = "task"
TRUNCATED = "truncated"
NO_GRAD_REASON = "no_grad_reason"
WRITTEN = "dressage_written"


def describe(sample: Any) -> str:
    """``sample index=… session=…#segment`` for error messages."""
    meta = getattr(sample, "metadata", None) or {}
    session = getattr(sample, "session_id", None) or meta.get(PARENT_TRAJ_ID)
    text = f"sample index={getattr(sample, 'index', None)} session={session}"
    if SEGMENT_INDEX in meta:
        text += f"#{meta[SEGMENT_INDEX]}"
    return text


def record_written(sample: Sample, loss_mask_sum: int) -> None:
    """Remember facts checked at write time: the mask sum, for the lengths it was taken at.

    Code that edits ``loss_mask`` afterwards must call this again (mark_aborted_no_grad does);
    the converter trusts the record only while ``response_length`` and the list lengths still
    match it, and re-checks a spread of samples in every batch.
    """
    sample.metadata[WRITTEN] = {
        "loss_mask_sum": int(loss_mask_sum),
        "response_length": int(sample.response_length),
    }


def recorded_loss_mask_sum(metadata: dict[str, Any], response_length: int) -> int | None:
    """The recorded count if it was taken at ``response_length`` (the caller checks the lists)."""
    return record_loss_mask_sum(metadata.get(WRITTEN), response_length)


def record_loss_mask_sum(record: Any, response_length: int) -> int | None:
    """:func:`recorded_loss_mask_sum` of the record itself (``metadata["dressage_written"]``)."""
    if type(record) is not dict or record.get("response_length") != response_length:
        return None
    value = record.get("loss_mask_sum")
    return value if type(value) is int else None


def cached_loss_mask_sum(sample: Sample) -> int | None:
    """The recorded trainable-token count, or None when absent or no longer consistent."""
    n = sample.response_length
    mask, logprobs = sample.loss_mask, sample.rollout_log_probs
    if mask is None or len(mask) != n or (logprobs is not None and len(logprobs) != n):
        return None
    return recorded_loss_mask_sum(sample.metadata, n)


def version_metadata(response_versions: list[int]) -> tuple[dict[str, Any], list[int]]:
    """Version facts of a response (positions relative to the response start).

    Returns the metadata entries (``version_spans`` lists ``[version, start, end)`` runs of
    generated tokens) and the sorted distinct versions.
    """
    arr = np.asarray(response_versions, dtype=np.int64)
    if arr.size == 0:
        bounds = np.zeros(1, dtype=np.int64)
    else:
        bounds = np.concatenate(([0], np.flatnonzero(np.diff(arr)) + 1, [arr.size]))
    spans = [
        [int(arr[s]), int(s), int(e)]
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        if arr[s] != NO_VERSION
    ]
    distinct = sorted({v for v, _, _ in spans})
    meta = {
        "dressage_partial_rollout": len(distinct) > 1,
        "version_spans": spans,
        "dressage_start_token_version": spans[0][0] if spans else None,
        "dressage_end_token_version": spans[-1][0] if spans else None,
    }
    return meta, distinct
