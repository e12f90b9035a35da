"""The durable trajectory store: one append-only log of what the proxy recorded.

    store = TrajectoryStore.open("proxy-store")            # replays the log
    await store.append_step(step)                           # durable before the agent's answer
    segments = await store.finalize("session-7")
    store.segments("session-7"); store.read_steps("session-7")
    store.steps_table(); store.segments_table()             # canonical Arrow (dressage.schemas)

Format: ``<dir>/trajectory.log``, one record a line, ``<crc32 of the JSON, 8 hex> <JSON>\\n``
(JSON never holds a raw newline), so ``cut -c10- trajectory.log | jq`` reads it. Each record
starts with its identity (kind, session, and a step's indices), a checksum of that identity and
the identity of the line before it, and ends with its identity again
(:mod:`~dressage.proxy.store_format`). Record kinds, field ``t``:

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
survives power loss. On open the log is replayed. Only one process may open a store (an
exclusive lock on ``<dir>/LOCK``, released by the OS on a crash).

Damage (a line that fails its checksum: a flipped byte, a torn write, garbage) costs at most
the damaged record's own session, from that record on; every other session reads back exactly
as it was written, and no read or export raises:

- whose record a damaged line held is told by the line after it (its ``prev``, which reads
  back), else by the line itself (a copy of its identity that the identity checksum confirms, or
  both copies agreeing: one flipped byte never hides it; a torn write keeps the head). A line
  that is two whole records whose line end was damaged, or a last record that lost only its
  line end, reads back whole (``ReplayReport.repaired``). A step index missing from a session's
  steps is charged to that session too (logs written before the identity fields rely on it);
- the session is charged (``SessionRecord.damage``: what was lost, where, how it is known; the
  trajectory export lists it under ``damage``). A lost ``step`` marks its segment from that step
  on: the segment keeps the steps before it, ``extra_info["no_grad_reason"]`` (``store_damaged:
  ...``, so the sample converter zeroes its loss mask) and ``extra_info["store_damage"]``; a last
  segment whose end is lost finishes ``abort``; the session's other segments are unchanged
  (:mod:`~dressage.proxy.store_segments`). A segment of which nothing reads back stays as an
  empty marked one, so the indices stay whole (the converter refuses an empty segment: the
  rollout retries that trajectory). A lost ``finalized`` or ``discarded`` still closes the
  session, a lost ``no_grad`` marks the whole trajectory, a lost ``options`` keeps the flag;
- a damaged line that names no session is skipped and counted (``ReplayReport.unattributed``);
  at the end of the log such lines are cut (a torn tail: a write cut short by a crash, or
  garbage), and whether they held an acknowledged record is not known;
- damaged lines stay in the log (except a cut tail), so every restart tells the same story.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Awaitable, Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dressage.proxy.store_format import FORMAT_FIELDS, decode, encode, identity
from dressage.proxy.store_index import SessionIndex, SessionRecord, SessionStatus
from dressage.proxy.store_replay import ReplayReport, replay
from dressage.proxy.store_segments import Damage, build_segments
from dressage.trajectory import Segment, StepRecord

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "LOG_NAME",
    "Damage",
    "ReplayReport",
    "SessionRecord",
    "SessionStatus",
    "StoreError",
    "TrajectoryStore",
]

LOG_NAME = "trajectory.log"


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message names the path and the session."""


class TrajectoryStore:
    """See the module docstring. Appends run on the event loop's thread (one writer)."""

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
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
        self.sessions = SessionIndex(self.path)
        # _prev: identity of the log's last line, which the next record names
        self.report, self._prev = replay(self.path, self._fd, self.sessions, fsync=fsync)
        self._size = os.fstat(self._fd).st_size
        self._written = 0
        self._synced = 0
        self._sync_task: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, directory: str | Path, *, fsync: bool = False) -> TrajectoryStore:
        return cls(Path(directory), fsync=fsync)

    # ------------------------------------------------------------------------------ appends
    def _write(self, record: dict[str, Any]) -> Awaitable[None]:
        """Write the record now (one ``write(2)``: it survives a crash of this process from here
        on); the returned awaitable completes when it is durable in the configured sense."""
        data = encode(record, self._prev)
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
        self._prev = identity(record)
        self.sessions.apply(record, offset, len(data))
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
        session = self.sessions.record(session_id)
        if session.status == "discarded":
            raise StoreError(f"session {session_id} was discarded; it cannot be finalized")
        if session.status == "open":
            await self._append({"t": "finalized", "session_id": session_id})
        return self.segments(session_id)

    async def mark_no_grad(self, session_id: str, reason: str) -> None:
        """Mark an open session's trajectory to train nothing (the first reason is kept)."""
        session = self.sessions.record(session_id)
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
        if self.sessions.record(session_id).status == "open":
            await self._append({"t": "discarded", "session_id": session_id})

    # ------------------------------------------------------------------------------ reads
    def _known(self, session_id: str) -> SessionRecord:
        session = self.sessions.get(session_id)
        if session is None:
            raise KeyError(session_id)
        return session

    def read_steps(self, session_id: str) -> list[StepRecord]:
        """The session's steps that read back from the log, in step order (one that no longer
        does is charged to the session, as on replay)."""
        session = self._known(session_id)
        steps = []
        for k, (offset, length) in enumerate(zip(session.offsets, session.lengths, strict=True)):
            record = decode(os.pread(self._fd, length, offset)[:-1])
            if record is None:
                ident = ("step", session_id, session.step_indices[k], session.segment_indices[k])
                self.sessions.charge(ident, "read_back", offset, length)
                continue
            for name in FORMAT_FIELDS:
                record.pop(name, None)
            steps.append(StepRecord.from_dict(record))
        return steps

    def segments(self, session_id: str) -> list[Segment]:
        """Segments of the session: all of them once finalized, else the closed ones.

        A segment followed by another one ended at a boundary: finish reason
        ``segment_boundary``, ``extra_info["boundary_reason"]`` from the next segment's first
        step. The last segment of a finalized session ends with its last step's finish reason.
        What the log lost is marked (the module docstring).
        """
        return self._segments(self._known(session_id), self.read_steps(session_id))

    def _segments(self, session: SessionRecord, steps: list[StepRecord]) -> list[Segment]:
        return build_segments(
            steps,
            session_id=session.session_id,
            finalized=session.status == "finalized",
            last_segment_index=session.last_segment_index,
            no_grad_reason=session.no_grad_reason,
            damage=session.damage or [],
        )

    def trajectory(self, session_id: str) -> dict[str, Any]:
        """Status, steps, (closed or final) segments and damage, as plain dicts.

        Raises:
            KeyError: the store has no record of the session.
        """
        session = self._known(session_id)
        steps = self.read_steps(session_id)
        segments = self._segments(session, steps)
        return {
            "session_id": session_id,
            "status": session.status,
            "steps": [s.to_dict() for s in steps],
            "segments": [s.to_dict() for s in segments],
            "damage": [d.to_dict() for d in session.damage or []],
        }

    def _exportable(self, session_ids: Iterable[str] | None, statuses: set[str]) -> list[str]:
        ids = list(self.sessions) if session_ids is None else list(session_ids)
        known = self.sessions
        return [sid for sid in ids if sid in known and known[sid].status in statuses]

    def steps_table(self, session_ids: Iterable[str] | None = None) -> pa.Table:
        """Steps of open and finalized sessions (not discarded ones), canonical schema."""
        from dressage.schemas import steps_to_table  # pyarrow: the export's, not serving's

        ids = self._exportable(session_ids, {"open", "finalized"})
        return steps_to_table([s for sid in ids for s in self.read_steps(sid)])

    def segments_table(self, session_ids: Iterable[str] | None = None) -> pa.Table:
        """Segments of finalized sessions, canonical schema."""
        from dressage.schemas import segments_to_table

        ids = self._exportable(session_ids, {"finalized"})
        return segments_to_table([s for sid in ids for s in self.segments(sid)])

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def damaged_sessions(self) -> int:
        """Sessions charged with a record the log lost."""
        return sum(1 for session in self.sessions.values() if session.damage)

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


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
