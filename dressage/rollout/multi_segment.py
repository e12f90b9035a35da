"""One trajectory, many samples: expand a session's segments into sibling slime ``Sample`` s.

An agent that rewrites or compacts its history leaves a trajectory of several append-only
segments (dressage.trajectory). Each segment trains as one sample; the siblings share the
trajectory's ``rollout_id`` so that slime's DP schedule keeps them in one step and its loss
reducer treats them as one rollout (docs/slime.md §3.4, §5). The last segment is the
*anchor*: the only sibling the reward hook scores (its ``reward`` starts as ``None``); the
others carry a ``0.0`` placeholder, and reward post-processing broadcasts the anchor's value to
them.

A custom generate (``dressage.rollout.generate.blackbox_dispatch.generate``) ends with::

    segments = store.finalize(session_id)
    return expand_segments_to_samples(sample, segments, args=args, agent_response=answer)

and, when the agent fails for good, with ``return mark_aborted_no_grad(sample, reason=...)``.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dressage.rollout.artifacts.samples import write_sample_from_segment
from dressage.slime.layout import resolve_rollout_ids
from dressage.slime.sample_meta import (
    INSTANCE_ID,
    NO_GRAD_REASON,
    NUM_SEGMENTS,
    PARENT_TRAJ_ID,
    SEGMENT_INDEX,
    TRUNCATED,
    describe,
    record_written,
)
from dressage.trajectory import Segment
from dressage.types import Sample

__all__ = ["expand_segments_to_samples", "mark_aborted_no_grad", "multi_segment_metrics"]


def expand_segments_to_samples(
    template_sample: Sample,
    segments: Sequence[Segment],
    *,
    args: Any,
    agent_response: str = "",
    session_id: str | None = None,
    instance_id: str | None = None,
) -> list[Sample]:
    """One deep copy of ``template_sample`` per segment, in ``segment_index`` order.

    Every sibling gets ``rollout_id`` (the template's, else its ``index``), ``session_id`` and
    ``metadata`` entries ``parent_traj_id`` (the session), ``segment_index``, ``num_segments``
    and ``instance_id`` (the prompt: the argument, else the template's
    ``metadata["instance_id"]``, else its ``group_index``). The anchor (last segment) gets
    ``reward=None`` and ``response=agent_response``; the others ``reward=0.0``.

    Raises:
        ValueError: no segments, duplicate or missing segment indices, segments of several
            sessions or of another session than ``session_id``, or no rollout or prompt id.
    """
    ordered = _ordered(segments, template_sample)
    session = _session(ordered, session_id, template_sample)
    prompt = _instance_id(template_sample, instance_id)
    rollout_id = template_sample.rollout_id
    if rollout_id is None:
        rollout_id = template_sample.index
    if rollout_id is None:
        raise ValueError(
            f"{describe(template_sample)} field=rollout_id: the template has neither a "
            "rollout_id nor an index, so its segments cannot be tied together"
        )
    out = []
    last = len(ordered) - 1
    for segment in ordered:
        sample = copy.deepcopy(template_sample)
        sample.rollout_id = rollout_id
        sample.metadata.update(
            {
                PARENT_TRAJ_ID: session,
                SEGMENT_INDEX: segment.segment_index,
                NUM_SEGMENTS: len(ordered),
                INSTANCE_ID: prompt,
            }
        )
        write_sample_from_segment(sample, segment, args=args)
        is_anchor = segment.segment_index == last
        # A trajectory the proxy marked no-grad is not scored (custom_rm skips it): reward 0.0.
        no_grad = NO_GRAD_REASON in sample.metadata
        sample.reward = None if is_anchor and not no_grad else 0.0
        if is_anchor:
            sample.response = agent_response
        out.append(sample)
    return out


def _ordered(segments: Sequence[Segment], template: Sample) -> list[Segment]:
    if not segments:
        raise ValueError(f"{describe(template)} field=segments: the trajectory has no segments")
    ordered = sorted(segments, key=lambda s: s.segment_index)
    indices = [s.segment_index for s in ordered]
    duplicates = sorted(i for i, c in Counter(indices).items() if c > 1)
    if duplicates:
        raise ValueError(
            f"{describe(template)} field=segment_index: duplicate segment indices {duplicates}"
        )
    if indices != list(range(len(ordered))):
        missing = sorted(set(range(indices[-1] + 1)) - set(indices))
        raise ValueError(
            f"{describe(template)} field=segment_index: indices {indices} are not "
            f"0..{len(indices) - 1} (missing {missing})"
        )
    return ordered


def _session(segments: list[Segment], session_id: str | None, template: Sample) -> str:
    sessions = sorted({s.session_id for s in segments})
    if len(sessions) != 1:
        raise ValueError(
            f"{describe(template)} field=session_id: segments come from sessions {sessions}"
        )
    if not sessions[0]:
        raise ValueError(f"{describe(template)} field=session_id: the segments have no session")
    if session_id is not None and session_id != sessions[0]:
        raise ValueError(
            f"{describe(template)} field=session_id: expected {session_id!r}, the segments "
            f"belong to {sessions[0]!r}"
        )
    return sessions[0]


def _instance_id(template: Sample, instance_id: str | None) -> str:
    value: Any = instance_id
    if value is None:
        value = template.metadata.get(INSTANCE_ID)
    if value is None:
        value = template.group_index
    if value is None:
        raise ValueError(
            f"{describe(template)} field=metadata.{INSTANCE_ID}: no prompt id (pass instance_id, "
            "or set metadata['instance_id'] or group_index on the template)"
        )
    return str(value)


def mark_aborted_no_grad(
    sample: Sample,
    *,
    reason: str,
    status: Sample.Status = Sample.Status.FAILED,
    fill_token_id: int = 0,
) -> Sample:
    """Turn a failed trajectory into one sample that counts as a rollout but trains nothing.

    The sample keeps its prompt id and rollout id (the template's, else its ``index``), so
    slime's DP schedule still counts it and its prompt keeps its trajectory count; it gets
    ``remove_sample=True`` (the converter zeroes its mask and reward post-processing leaves it
    out of the group statistics), ``reward=0.0`` (so no reward hook scores it), an all-zero
    loss mask, and ``metadata["no_grad_reason"]``.

    ``status`` defaults to FAILED, not ABORTED: slime's fully-async rollout pushes groups with
    an ABORTED sample back into the buffer to be resumed, which would rerun a failed agent
    forever. Pass ``Sample.Status.ABORTED`` when a resume is what you want.

    A response needs at least one position: a sample with fewer than two tokens gets
    ``[fill_token_id] * 2`` (one prompt, one masked response position).
    """
    if sample.rollout_id is None:
        sample.rollout_id = sample.index
    meta = sample.metadata
    meta.setdefault(PARENT_TRAJ_ID, sample.session_id or f"failed-{sample.index}")
    if meta.get(INSTANCE_ID) is None and sample.group_index is not None:
        meta[INSTANCE_ID] = str(sample.group_index)
    meta[SEGMENT_INDEX], meta[NUM_SEGMENTS] = 0, 1
    meta[NO_GRAD_REASON] = reason
    if len(sample.tokens) < 2:
        sample.tokens = [fill_token_id] * 2
    n = min(max(sample.response_length, 1), len(sample.tokens) - 1)
    sample.response_length = n
    sample.loss_mask = [0] * n
    sample.rollout_log_probs = [0.0] * n
    if sample.teacher_log_probs is not None:
        sample.teacher_log_probs = [0.0] * n
    sample.reward = 0.0
    sample.remove_sample = True
    sample.status = status
    record_written(sample, 0)
    return sample


def multi_segment_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Trajectory-level counts for rollout logging (keys ``multi_segment/*``)."""
    if not samples:
        return {}
    rollout_ids = resolve_rollout_ids(samples)
    per_rollout = Counter(rollout_ids)
    no_grad = {r for r, s in zip(rollout_ids, samples, strict=True) if NO_GRAD_REASON in s.metadata}
    sizes = list(per_rollout.values())
    n_traj, n = len(sizes), len(samples)
    return {
        "multi_segment/samples": float(n),
        "multi_segment/trajectories": float(n_traj),
        "multi_segment/segments_per_trajectory_mean": n / n_traj,
        "multi_segment/segments_per_trajectory_max": float(max(sizes)),
        "multi_segment/multi_segment_fraction": sum(k > 1 for k in sizes) / n_traj,
        "multi_segment/no_grad_fraction": len(no_grad) / n_traj,
        "multi_segment/capped_fraction": sum(bool(s.metadata.get(TRUNCATED)) for s in samples) / n,
        "multi_segment/partial_rollout_fraction": (
            sum(bool(s.metadata.get("dressage_partial_rollout")) for s in samples) / n
        ),
    }
