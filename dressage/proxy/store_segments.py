"""A session's segments, rebuilt from its steps, with what the store lost marked.

    segments = build_segments(steps, session_id="s1", finalized=True, last_segment_index=2,
                              no_grad_reason=None, damage=[...])

Used by :class:`~dressage.proxy.store.TrajectoryStore` on every read (segments are not stored):
the damage contract is in that module's docstring. A :class:`Damage` is one thing the store
could not read back for a session; a step it lost marks that step's segment from that step on:
the segment keeps the steps before it (possibly none), ``extra_info["no_grad_reason"]`` and
``extra_info["store_damage"]``; its end is lost, so if it is the session's last segment its
finish reason is ``abort``. Segments without a lost step are rebuilt exactly as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dressage.slime.sample_meta import NO_GRAD_REASON, version_metadata
from dressage.trajectory import FinishReason, Segment, StepRecord

__all__ = ["STORE_DAMAGE", "STORE_DAMAGED", "Damage", "KnownFrom", "build_segments"]

STORE_DAMAGE = "store_damage"
"""``extra_info`` key of a marked segment: what was lost and how the store knows."""
STORE_DAMAGED = "store_damaged"
"""Prefix of the ``no_grad_reason`` of a segment the store could not read back whole."""

KnownFrom = Literal["next_record", "own_header", "step_gap", "read_back", "steps_disagree"]
_HOW = {
    "next_record": "named by the record after it",
    "own_header": "named by its own header",
    "step_gap": "the session's steps skip it",
    "read_back": "it no longer reads back",
    "steps_disagree": "the steps around it do not add up",
}


@dataclass(frozen=True)
class Damage:
    """One record of a session that the store could not read back."""

    record: str
    """Its kind: ``step``, ``finalized``, ``discarded``, ``no_grad`` or ``options``."""
    known_from: KnownFrom
    at: int | None = None
    """Byte offset of the damaged line in the log (None: not known, e.g. a step gap)."""
    size: int | None = None
    step_index: int | None = None
    segment_index: int | None = None

    @property
    def what(self) -> str:
        """``record of step 3 (segment 0)``, ``finalized record``."""
        if self.step_index is None:
            return f"{self.record} record"
        segment = f" (segment {self.segment_index})" if self.segment_index is not None else ""
        return f"record of step {self.step_index}{segment}"

    @property
    def reason(self) -> str:
        where = f" at byte {self.at}" if self.at is not None else ""
        return f"{self.what}{where} does not read back ({_HOW[self.known_from]})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "record": self.record,
            "step_index": self.step_index,
            "segment_index": self.segment_index,
            "at": self.at,
            "bytes": self.size,
            "known_from": self.known_from,
            "reason": self.reason,
        }


def build_segments(
    steps: Sequence[StepRecord],
    *,
    session_id: str,
    finalized: bool,
    last_segment_index: int,
    no_grad_reason: str | None,
    damage: Sequence[Damage],
) -> list[Segment]:
    """All segments of a finalized session, else the closed ones (see the module docstring).

    ``steps``: the session's steps that read back, in step order.
    """
    by_segment: dict[int, list[StepRecord]] = {}
    for step in steps:
        by_segment.setdefault(step.segment_index, []).append(step)
    lost = _lost_steps(steps, damage)
    top = max([last_segment_index, *by_segment, *lost])
    out = []
    for index in range(top + 1):
        if index == top and not finalized:
            break  # the open segment
        found = by_segment.get(index, [])
        kept, first_lost, records = _kept(found, lost.get(index))
        if not found and index not in lost:
            records = [Damage("step", "step_gap", segment_index=index)]
        head = kept[0].extra.get("segment", {}) if kept else {}
        info: dict[str, Any] = {**head.get("flags", {}), "num_steps": len(kept)}
        if index < top:
            finish = FinishReason.SEGMENT_BOUNDARY.value
            _boundary(info, by_segment.get(index + 1, []), kept)
        else:
            finish = kept[-1].finish_reason if kept and not records else FinishReason.ABORT.value
        pauses = sum(int(step.extra.get("pauses", 0)) for step in kept)
        if pauses:
            info["pauses"] = pauses
        if no_grad_reason is not None:
            info[NO_GRAD_REASON] = no_grad_reason
        if records:
            reason = f"{STORE_DAMAGED}: {'; '.join(d.reason for d in records)}"
            info.setdefault(NO_GRAD_REASON, reason)
            info[STORE_DAMAGE] = {
                "first_lost_step": first_lost,
                "steps_kept": len(kept),
                "reason": reason,
                "records": [d.to_dict() for d in records],
            }
        out.append(_segment(session_id, index, kept, finish, info))
    return out


def _lost_steps(
    steps: Sequence[StepRecord], damage: Sequence[Damage]
) -> dict[int, list[tuple[int | None, Damage]]]:
    """Per segment, the steps lost from it (step index, or None when not known) and why: the
    store's charges, and any step index the surviving steps skip."""
    present = sorted(s.step_index for s in steps)
    charged = {d.step_index for d in damage if d.record == "step"}
    lost: dict[int, list[tuple[int | None, Damage]]] = {}
    found = [d for d in damage if d.record == "step"]
    if present:
        missing = set(range(present[-1] + 1)) - set(present) - charged
        found += [Damage("step", "step_gap", step_index=k) for k in sorted(missing)]
    for d in found:
        segment = d.segment_index
        if segment is None:
            segment = _segment_of(d.step_index, steps)
        lost.setdefault(segment, []).append((d.step_index, d))
    return lost


def _segment_of(step_index: int | None, steps: Sequence[StepRecord]) -> int:
    """The segment a lost step most likely belonged to: that of the last step before it (a
    step opens a segment only with ``prefix_length`` 0, which the next step would show), else
    that of the first one after it."""
    if step_index is None:
        return steps[-1].segment_index if steps else 0
    before = [s for s in steps if s.step_index < step_index]
    if before:
        return before[-1].segment_index
    after = [s for s in steps if s.step_index > step_index]
    return after[0].segment_index if after else 0


def _kept(
    found: list[StepRecord], lost: list[tuple[int | None, Damage]] | None
) -> tuple[list[StepRecord], int | None, list[Damage]]:
    """The steps of a segment that still add up, the first lost step index, and the damage."""
    records = [d for _, d in lost or []]
    known = [k for k, _ in lost or [] if k is not None]
    first_lost = min(known) if known else None
    if lost and first_lost is None:
        first_lost = found[0].step_index if found else None  # somewhere: keep nothing
    kept: list[StepRecord] = []
    tokens = 0
    for step in found:
        if first_lost is not None and step.step_index >= first_lost:
            break
        if step.prefix_length != tokens:
            records.append(Damage("step", "steps_disagree", step_index=step.step_index))
            first_lost = step.step_index if first_lost is None else first_lost
            break
        kept.append(step)
        tokens += len(step.prompt_delta_ids) + len(step.output_ids)
    return kept, first_lost, records


def _boundary(info: dict[str, Any], following: list[StepRecord], kept: list[StepRecord]) -> None:
    """A segment followed by another ended at a boundary; the next one's first step says why
    (unknown when that step was lost)."""
    head = following[0] if following and following[0].prefix_length == 0 else None
    info["boundary_reason"] = (head.boundary_reason if head else None) or "unknown"
    info["boundary_detail"] = head.extra.get("boundary_detail", "") if head else ""
    if kept:
        info["last_finish_reason"] = kept[-1].finish_reason


def _segment(
    session_id: str, index: int, kept: list[StepRecord], finish: str, info: dict[str, Any]
) -> Segment:
    record_versions = bool(
        info.get("record_token_versions", True) or info.get("mask_nonlast_version_tokens")
    )
    if kept:
        segment = Segment.from_steps(
            kept,
            messages=[m for step in kept for m in step.messages],
            finish_reason=finish,
            extra_info=info,
            record_versions=record_versions,
        )
    else:  # nothing of it reads back: an empty, marked segment keeps the indices whole
        segment = Segment(
            session_id=session_id,
            segment_index=index,
            tokens=[],
            full_loss_mask=[],
            full_logprobs=[],
            messages=[],
            finish_reason=finish,
            extra_info={"weight_versions": [], **info},
            full_versions=[] if record_versions else None,
        )
    if segment.full_versions is not None:
        segment.extra_info["version_spans"] = version_metadata(segment.full_versions)[0][
            "version_spans"
        ]
    return segment
