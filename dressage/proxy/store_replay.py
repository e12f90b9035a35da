"""Replay of the trajectory store's log on open: every line read back, or charged, or cut.

    report, last = replay(path, fd, index, fsync=False)   # fills index; last: the last line's
                                                          # identity (the next record names it)

What damage costs is :mod:`dressage.proxy.store`'s docstring. Here: a line that reads back is
applied; a damaged line is charged to the session that the next line that reads back names
(its ``prev``), or that its own head names; a line that is two records glued by a damaged line
end, or a last record whose line end alone was lost, reads back whole (``repaired``); damaged
lines at the end that name no session are cut (a torn tail).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dressage.proxy.store_format import (
    Identity,
    claimed_identity,
    decode,
    identity,
    split_glued,
    witness,
)
from dressage.proxy.store_index import SessionIndex
from dressage.proxy.store_segments import KnownFrom

__all__ = ["ReplayReport", "replay"]

log = logging.getLogger("dressage.proxy.store")


@dataclass(frozen=True)
class ReplayReport:
    records: int
    skipped_corrupt: int
    """Damaged lines kept in the log and skipped (charged to their session or not)."""
    torn_tail_bytes: int
    unattributed: int = 0
    """Damaged lines (kept or cut) whose session cannot be told."""
    repaired: int = 0
    """Records that read back whole although their line end was damaged."""


@dataclass
class _Bad:
    """A damaged line met during the replay."""

    offset: int
    length: int
    claimed: Identity | None
    """The identity its own head gives (checked), if any."""
    whole: bool
    """It ends with a newline."""


def replay(
    path: Path, fd: int, index: SessionIndex, *, fsync: bool
) -> tuple[ReplayReport, Identity | None]:
    """Replay the log at ``path`` (``fd``: open for appending) into ``index``."""
    return _Replay(path, fd, index).run(fsync=fsync)


class _Replay:
    def __init__(self, path: Path, fd: int, index: SessionIndex) -> None:
        self.path, self.fd, self.index = path, fd, index
        self.records = self.skipped = self.unattributed = self.repaired = 0
        self.last: Identity | None = None

    def run(self, *, fsync: bool) -> tuple[ReplayReport, Identity | None]:
        pending: list[_Bad] = []  # damaged lines since the last line that read back
        offset = 0
        with open(self.path, "rb") as f:
            for line in f:
                for start, length, record in self._records_of(line, offset):
                    if record is None:
                        whole = line.endswith(b"\n")
                        pending.append(_Bad(offset, len(line), claimed_identity(line), whole))
                        continue
                    self._resolve(pending, witness(record))
                    pending = []
                    self.index.apply(record, offset + start, length)
                    self.last = identity(record)
                    self.records += 1
                offset += len(line)
        torn = self._close_tail(pending, offset)
        if fsync and (torn or self.repaired or pending):
            os.fdatasync(self.fd)
        report = ReplayReport(
            records=self.records,
            skipped_corrupt=self.skipped,
            torn_tail_bytes=torn,
            unattributed=self.unattributed,
            repaired=self.repaired,
        )
        return report, self.last

    def _records_of(self, line: bytes, offset: int) -> list[tuple[int, int, dict[str, Any] | None]]:
        """``(start, length, record or None)`` of the records in one line of the log: one, or
        two when a damaged line end glued them, or a last line whose line end alone is lost."""
        if not line.endswith(b"\n"):
            for body, lost in ((line, 0), (line[:-1], 1)):
                record = decode(body)
                if record is not None:  # whole: terminate it, so appends start clean
                    os.ftruncate(self.fd, offset + len(line) - lost)
                    os.write(self.fd, b"\n")  # O_APPEND: lands at the (new) end
                    self.repaired += 1
                    log.warning(
                        "store %s: the last record (at byte %d) had lost its line end; it reads "
                        "back whole", self.path, offset,
                    )  # fmt: skip
                    return [(0, len(body) + 1, record)]
            return [(0, len(line), None)]
        record = decode(line[:-1])
        if record is not None:
            return [(0, len(line), record)]
        at = split_glued(line[:-1])
        if at is None:
            return [(0, len(line), None)]
        self.repaired += 1
        log.warning(
            "store %s: the line at byte %d holds two records whose line end was damaged; both "
            "read back", self.path, offset,
        )  # fmt: skip
        return [(0, at, decode(line[: at - 1])), (at, len(line) - at, decode(line[at:-1]))]

    def _resolve(self, pending: list[_Bad], named: Identity | None) -> None:
        """Charge the damaged lines before a line that read back: the last one is what that
        line ``named``; the others name themselves, or no one."""
        for k, bad in enumerate(pending):
            ident = bad.claimed
            how: KnownFrom = "own_header"
            if k == len(pending) - 1 and named is not None:
                ident, how = named, "next_record"
            self.skipped += 1
            if ident is None:
                self.unattributed += 1
                log.warning(
                    "store %s: the record at byte %d (%d bytes) does not read back and names no "
                    "session; what it held is lost", self.path, bad.offset, bad.length,
                )  # fmt: skip
            else:
                self.index.charge(ident, how, bad.offset, bad.length)

    def _close_tail(self, tail: list[_Bad], size: int) -> int:
        """Damaged lines at the end of the log have no line after them to name them: up to the
        last one that names its own session they stay (charged); the rest is cut (returns how
        many bytes)."""
        keep = len(tail)
        while keep and tail[keep - 1].claimed is None:
            keep -= 1
        for bad in tail[:keep]:
            self.skipped += 1
            if bad.claimed is None:
                self.unattributed += 1
            else:
                self.index.charge(bad.claimed, "own_header", bad.offset, bad.length, last=True)
        if keep:
            self.last = tail[keep - 1].claimed
            if not tail[keep - 1].whole:  # a torn line that stays: appends start on their own
                os.write(self.fd, b"\n")
        if keep == len(tail):
            return 0
        cut = tail[keep].offset
        self.unattributed += len(tail) - keep
        log.warning(
            "store %s: cut %d bytes at byte %d: they do not read back as a record and name no "
            "session (a write cut short by a crash, or damage); whether they held an "
            "acknowledged record is not known", self.path, size - cut, cut,
        )  # fmt: skip
        os.ftruncate(self.fd, cut)
        return size - cut
