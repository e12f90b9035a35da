"""The durable trajectory store: one append-only log of what the proxy recorded.

    store = TrajectoryStore.open("proxy-store")            # replays the log
    await store.append_step(step)                           # durable before the agent's answer
    segments = await store.finalize("session-7")
    store.segments("session-7"); store.read_steps("session-7")
    store.steps_table(); store.segments_table()             # canonical Arrow (dressage.schemas)

Format: ``<dir>/trajectory.log``, one record a line, ``<crc32 of the JSON, 8 hex> <JSON>\\n``
(JSON never holds a raw newline), so ``cut -c10- trajectory.log | jq`` reads it. Record kinds,
field ``t``:

- ``step``: a :class:`~dressage.trajectory.StepRecord` (its ``to_dict()``). The first step of a
  segment carries ``extra["segment"]``: the config flags, tools and template kwargs it was built
  with; a step that opened a segment after a boundary carries ``boundary_reason``;
- ``finalized``: the session is closed; its last segment ends with its last step's finish reason;
- ``discarded``: the session is dropped (its records stay; it is left out of exports);
- ``no_grad``: the trajectory must train nothing (``reason``; e.g. it spanned more rollout pauses
  than the proxy allows); every segment then carries ``extra_info["no_grad_reason"]``;
- ``options``: what the rollout asked of the session's calls when it opened the session
  (``partial_rollout``: keep partial output across pauses), so that a restart keeps it.

Segments that record token versions (``record_token_versions`` or
``mask_nonlast_version_tokens`` in the segment's flags) also carry ``extra_info["version_spans"]``
(``[version, start, end)`` runs of generated tokens over the segment's token positions) and, when
a rollout pause stopped one of its calls, ``extra_info["pauses"]`` (how many times).

One call is one record, so a call is recorded whole or not at all. Segments are not stored
twice: they are rebuilt from the steps (``Segment.from_steps``) on every read, identical before
and after a restart. A segment followed by another one ended at a boundary (finish reason
``segment_boundary``, ``extra_info["boundary_reason"]`` from the next segment's first step).

Durability: every append is one ``write(2)`` to the log before the call returns, so an
acknowledged step survives ``kill -9`` of the proxy (the OS holds it). With ``fsync=True``
appends also wait for ``fdatasync`` (group commit: concurrent appends share one sync), which
survives power loss. On open the log is replayed; a torn last record (a crash mid-write: no
newline, or a bad checksum) is reported and cut off; a damaged record in the middle is skipped and
counted. Only one process may open a store (an exclusive lock on ``<dir>/LOCK``, released by
the OS on a crash).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import zlib
from array import array
from collections.abc import Awaitable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from dressage.rollout.artifacts.samples import version_metadata
from dressage.rollout.sample_meta import NO_GRAD_REASON
from dressage.schemas import segments_to_table, steps_to_table
from dressage.trajectory import FinishReason, Segment, StepRecord

__all__ = ["ReplayReport", "SessionRecord", "StoreError", "TrajectoryStore"]

log = logging.getLogger(__name__)

LOG_NAME = "trajectory.log"
SessionStatus = Literal["open", "finalized", "discarded"]


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message names the path and the session."""


@dataclass
class SessionRecord:
    """What the store knows of one session (small: record positions, not records)."""

    session_id: str
    status: SessionStatus = "open"
    offsets: array[int] = field(default_factory=lambda: array("q"))
    lengths: array[int] = field(default_factory=lambda: array("i"))
    """Position and length of each ``step`` record, in step order."""
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

    @property
    def num_steps(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class ReplayReport:
    records: int
    skipped_corrupt: int
    torn_tail_bytes: int


def _encode(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
    return b"%08x " % zlib.crc32(payload) + payload + b"\n"


def _decode(line: bytes) -> dict[str, Any] | None:
    """The record of one line (without its newline), or None if its checksum fails."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        record = json.loads(payload)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class TrajectoryStore:
    """See the module docstring. Appends run on the event loop's thread (one writer)."""

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.sessions: dict[str, SessionRecord] = {}
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreError(
                f"the store {self.directory} is in use by another process (LOCK is held)"
            ) from None
        self.path = self.directory / LOG_NAME
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if created and fsync:
            _fsync_dir(self.directory)
        self.report = self._replay()
        self._size = os.fstat(self._fd).st_size
        self._written = 0
        self._synced = 0
        self._sync_task: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, directory: str | Path, *, fsync: bool = False) -> TrajectoryStore:
        return cls(Path(directory), fsync=fsync)

    # ------------------------------------------------------------------------------ replay
    def _replay(self) -> ReplayReport:
        records = corrupt = 0
        offset = 0
        good_end = 0  # end of the last record that read back: anything after it is a torn tail
        with open(self.path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break
                record = _decode(line[:-1])
                if record is None:
                    corrupt += 1
                    log.warning("store %s: damaged record at byte %d", self.path, offset)
                else:
                    self._apply(record, offset, len(line))
                    records += 1
                    good_end = offset + len(line)
                offset += len(line)
        size = os.fstat(self._fd).st_size
        torn = size - good_end
        if torn:
            corrupt -= sum(1 for _ in _lines_between(self.path, good_end, offset))
            log.warning(
                "store %s: cutting a torn tail (%d bytes at %d): it was never acknowledged",
                self.path, torn, good_end,
            )  # fmt: skip
            os.ftruncate(self._fd, good_end)
        return ReplayReport(records=records, skipped_corrupt=corrupt, torn_tail_bytes=torn)

    def _session(self, session_id: str) -> SessionRecord:
        record = self.sessions.get(session_id)
        if record is None:
            record = self.sessions[session_id] = SessionRecord(session_id)
        return record

    def _apply(self, record: dict[str, Any], offset: int, length: int) -> None:
        kind = record.get("t")
        session = self._session(str(record.get("session_id")))
        if kind == "step":
            session.offsets.append(offset)
            session.lengths.append(length)
            session.next_step_index = max(session.next_step_index, int(record["step_index"]) + 1)
            session.last_segment_index = int(record["segment_index"])
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

    # ------------------------------------------------------------------------------ appends
    def _write(self, record: dict[str, Any]) -> Awaitable[None]:
        """Write the record now (one ``write(2)``: it survives a crash of this process from here
        on); the returned awaitable completes when it is durable in the configured sense."""
        data = _encode(record)
        offset = self._size
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # regular files write whole; a signal could split one
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            # The tail may now hold a partial record: cut it so the next append starts clean.
            os.ftruncate(self._fd, offset)
            raise StoreError(
                f"store {self.path}: cannot append a {record.get('t')} record of session "
                f"{record.get('session_id')}: {exc}"
            ) from exc
        self._size += len(data)
        self._apply(record, offset, len(data))
        if not self.fsync:
            return _DONE
        self._written += 1
        return self._sync_through(self._written, record)

    async def _append(self, record: dict[str, Any]) -> None:
        await self._write(record)

    async def _sync_through(self, target: int, record: dict[str, Any]) -> None:
        while self._synced < target:
            if self._sync_task is None:
                self._sync_task = asyncio.get_running_loop().create_task(self._sync())
            try:
                await asyncio.shield(self._sync_task)
            except OSError as exc:
                raise StoreError(
                    f"store {self.path}: fdatasync failed after a {record.get('t')} record of "
                    f"session {record.get('session_id')}: {exc}"
                ) from exc

    async def _sync(self) -> None:
        covered = self._written
        try:
            await asyncio.to_thread(os.fdatasync, self._fd)
        finally:
            self._sync_task = None
        self._synced = max(self._synced, covered)

    def write_step(self, step: StepRecord) -> Awaitable[None]:
        """Write the step now; await the result for durability (see :meth:`_write`)."""
        session = self.sessions.get(step.session_id)
        if session is not None and session.status != "open":
            raise StoreError(
                f"store {self.path}: session {step.session_id} is {session.status}; "
                f"step {step.step_index} not recorded"
            )
        return self._write({"t": "step", **step.to_dict()})

    async def append_step(self, step: StepRecord) -> None:
        await self.write_step(step)

    async def finalize(self, session_id: str) -> list[Segment]:
        """Close the session; its last segment ends with its last step's finish reason.
        Finalizing again returns the same segments (nothing new is written)."""
        session = self._session(session_id)
        if session.status == "discarded":
            raise StoreError(f"session {session_id} was discarded; it cannot be finalized")
        if session.status == "open":
            await self._append({"t": "finalized", "session_id": session_id})
        return self.segments(session_id)

    async def mark_no_grad(self, session_id: str, reason: str) -> None:
        """Mark an open session's trajectory to train nothing (the first reason is kept)."""
        session = self._session(session_id)
        if session.status != "open" or session.no_grad_reason is not None:
            return
        await self._append({"t": "no_grad", "session_id": session_id, "reason": reason})

    async def set_partial_rollout(self, session_id: str, partial_rollout: bool) -> None:
        """Record the session's partial rollout flag (nothing is written when it is unchanged).

        Raises:
            StoreError: the session is finalized or discarded.
        """
        session = self.sessions.get(session_id)
        if session is not None and session.status != "open":
            raise StoreError(f"session {session_id} is {session.status}; its options are final")
        if (session.partial_rollout if session is not None else False) == partial_rollout:
            return
        record = {"t": "options", "session_id": session_id, "partial_rollout": partial_rollout}
        await self._append(record)

    async def discard(self, session_id: str) -> None:
        if self._session(session_id).status == "open":
            await self._append({"t": "discarded", "session_id": session_id})

    # ------------------------------------------------------------------------------ reads
    def _known(self, session_id: str) -> SessionRecord:
        session = self.sessions.get(session_id)
        if session is None:
            raise KeyError(session_id)
        return session

    def read_steps(self, session_id: str) -> list[StepRecord]:
        """The session's steps, read back from the log, in step order."""
        session = self._known(session_id)
        steps = []
        for offset, length in zip(session.offsets, session.lengths, strict=True):
            line = os.pread(self._fd, length, offset)
            record = _decode(line[:-1])
            if record is None:
                raise StoreError(
                    f"store {self.path}: the step record of session {session_id} at byte "
                    f"{offset} no longer reads back"
                )
            record.pop("t")
            steps.append(StepRecord.from_dict(record))
        return steps

    def segments(self, session_id: str) -> list[Segment]:
        """Segments of the session: all of them once finalized, else the closed ones.

        A segment followed by another one ended at a boundary: finish reason
        ``segment_boundary``, ``extra_info["boundary_reason"]`` from the next segment's first
        step. The last segment of a finalized session ends with its last step's finish reason.
        """
        session = self._known(session_id)
        by_segment: dict[int, list[StepRecord]] = {}
        for step in self.read_steps(session_id):
            by_segment.setdefault(step.segment_index, []).append(step)
        indices = sorted(by_segment)
        out = []
        for k, index in enumerate(indices):
            steps = by_segment[index]
            head = steps[0].extra.get("segment", {})
            info: dict[str, Any] = dict(head.get("flags", {}))
            info["num_steps"] = len(steps)
            if k + 1 < len(indices):
                following = by_segment[indices[k + 1]][0]
                finish = FinishReason.SEGMENT_BOUNDARY.value
                info["boundary_reason"] = following.boundary_reason or "unknown"
                info["boundary_detail"] = following.extra.get("boundary_detail", "")
                info["last_finish_reason"] = steps[-1].finish_reason
            elif session.status == "finalized":
                finish = steps[-1].finish_reason
            else:
                continue  # the open segment
            record_versions = bool(
                info.get("record_token_versions", True) or info.get("mask_nonlast_version_tokens")
            )
            pauses = sum(int(step.extra.get("pauses", 0)) for step in steps)
            if pauses:
                info["pauses"] = pauses
            if session.no_grad_reason is not None:
                info[NO_GRAD_REASON] = session.no_grad_reason
            segment = Segment.from_steps(
                steps,
                messages=[m for step in steps for m in step.messages],
                finish_reason=finish,
                extra_info=info,
                record_versions=record_versions,
            )
            if segment.full_versions is not None:
                segment.extra_info["version_spans"] = version_metadata(segment.full_versions)[0][
                    "version_spans"
                ]
            out.append(segment)
        return out

    def _exportable(self, session_ids: Iterable[str] | None, statuses: set[str]) -> list[str]:
        ids = list(self.sessions) if session_ids is None else list(session_ids)
        known = self.sessions
        return [sid for sid in ids if sid in known and known[sid].status in statuses]

    def steps_table(self, session_ids: Iterable[str] | None = None) -> pa.Table:
        """Steps of open and finalized sessions (not discarded ones), canonical schema."""
        ids = self._exportable(session_ids, {"open", "finalized"})
        return steps_to_table([s for sid in ids for s in self.read_steps(sid)])

    def segments_table(self, session_ids: Iterable[str] | None = None) -> pa.Table:
        """Segments of finalized sessions, canonical schema."""
        ids = self._exportable(session_ids, {"finalized"})
        return segments_to_table([s for sid in ids for s in self.segments(sid)])

    @property
    def size_bytes(self) -> int:
        return self._size

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd = self._lock_fd = -1


class _Done:
    """An awaitable that is already complete (the no-fsync durability)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_DONE = _Done()


def _lines_between(path: Path, start: int, end: int) -> list[bytes]:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).splitlines()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
