"""What the trajectory store knows of each session: record positions, status, and damage.

    index = SessionIndex(path)                     # path: the log, for messages
    index.apply(record, offset, length)            # a record that read back (or was written)
    index.charge(identity, "next_record", at, size) # a record the log lost

The meaning of the records and of a charge is :mod:`dressage.proxy.store`'s docstring; this
module keeps the bookkeeping small (positions, not records) so that a store of many sessions
replays quickly.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dressage.proxy.store_format import Identity
from dressage.proxy.store_segments import STORE_DAMAGED, Damage, KnownFrom

__all__ = ["SessionIndex", "SessionRecord", "SessionStatus"]

log = logging.getLogger("dressage.proxy.store")

SessionStatus = Literal["open", "finalized", "discarded"]


@dataclass
class SessionRecord:
    """What the store knows of one session (small: record positions, not records)."""

    session_id: str
    status: SessionStatus = "open"
    offsets: array[int] = field(default_factory=lambda: array("q"))
    lengths: array[int] = field(default_factory=lambda: array("i"))
    """Position and length of each ``step`` record, in step order."""
    step_indices: array[int] = field(default_factory=lambda: array("q"))
    segment_indices: array[int] = field(default_factory=lambda: array("q"))
    """Step and segment index of each ``step`` record (to name one that stops reading back)."""
    boundaries: dict[str, int] | None = None
    """How many segments each boundary reason opened."""
    next_step_index: int = 0
    last_segment_index: int = -1
    """Segment of the last step (-1: no step yet)."""
    tokens: int = 0
    no_grad_reason: str | None = None
    """Set by a ``no_grad`` record: why the trajectory trains nothing."""
    partial_rollout: bool = False
    """Set by an ``options`` record: the session's calls keep partial output across pauses."""
    damage: list[Damage] | None = None
    """Records of this session that the log lost (None: none)."""

    @property
    def num_steps(self) -> int:
        return len(self.offsets)


class SessionIndex(dict[str, SessionRecord]):
    """Every session of one store, by id (a dict, with the store's two ways to change it)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def record(self, session_id: str) -> SessionRecord:
        """The session's record, added when it is new."""
        record = self.get(session_id)
        if record is None:
            record = self[session_id] = SessionRecord(session_id)
        return record

    def apply(self, record: dict[str, Any], offset: int, length: int) -> None:
        """A record that reads back, at ``offset`` (``length`` bytes) of the log."""
        kind = record.get("t")
        session = self.record(str(record.get("session_id")))
        if kind == "step":
            step, segment = int(record["step_index"]), int(record["segment_index"])
            for missing in range(session.next_step_index, step):  # steps the log lost
                self.charge(("step", session.session_id, missing, None), "step_gap", None, None)
            session.offsets.append(offset)
            session.lengths.append(length)
            session.step_indices.append(step)
            session.segment_indices.append(segment)
            session.next_step_index = max(session.next_step_index, step + 1)
            session.last_segment_index = max(session.last_segment_index, segment)
            session.tokens += len(record["prompt_delta_ids"]) + len(record["output_ids"])
            reason = record.get("boundary_reason")
            if reason:
                session.boundaries = session.boundaries or {}
                session.boundaries[reason] = session.boundaries.get(reason, 0) + 1
        elif kind == "finalized":
            session.status = "finalized"
        elif kind == "discarded":
            session.status = "discarded"
        elif kind == "no_grad":
            session.no_grad_reason = str(record.get("reason") or "unknown")
        elif kind == "options":
            session.partial_rollout = bool(record.get("partial_rollout"))
        else:
            log.warning("store %s: unknown record kind %r at byte %d", self.path, kind, offset)

    def charge(
        self,
        ident: Identity,
        how: KnownFrom,
        at: int | None,
        size: int | None,
        *,
        last: bool = False,
    ) -> None:
        """A record the log lost, charged to its session: what the session still knows of it
        is kept (a lost ``finalized`` still closes it), and a warning says what it costs."""
        kind, session_id, step, segment = ident
        session = self.record(session_id)
        damage = Damage(kind, how, at, size, step, segment)
        if session.damage is None:
            session.damage = []
        if damage in session.damage:
            return
        session.damage.append(damage)
        cost = "what it held is not known; nothing else changes"
        if kind == "step":
            session.next_step_index = max(session.next_step_index, (step or 0) + 1)
            if segment is not None:
                session.last_segment_index = max(session.last_segment_index, segment)
            cost = f"the session's segment {segment} is marked from step {step} on"
            if segment is None:
                cost = "the segment it belonged to is marked from it on"
        elif kind == "finalized" and session.status == "open":
            session.status, cost = "finalized", "the session stays finalized"
        elif kind == "discarded":
            session.status, cost = "discarded", "the session stays discarded"
        elif kind == "no_grad" and session.no_grad_reason is None:
            session.no_grad_reason = f"{STORE_DAMAGED}: {damage.reason}"
            cost = "its trajectory trains nothing"
        if last:
            cost = f"it is the log's last record, whether acknowledged is not known; {cost}"
        log.warning(
            "store %s: the %s of session %s%s; %s", self.path, damage.what, session_id,
            damage.reason.removeprefix(damage.what), cost,
        )  # fmt: skip
