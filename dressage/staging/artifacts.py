"""Artifacts on any fsspec URL: Parquet tables in canonical schemas, a manifest written last.

    from dressage.staging import ArtifactWriter, open_artifact

    with ArtifactWriter("file:///data/run-7/rollout-3") as w:       # or memory://, s3://, gs://
        w.write_table("segments", segments_table)                      # cast to the schema
        w.write_blob("report.json", report_bytes, media_type="application/json")
    art = open_artifact("file:///data/run-7/rollout-3")                # refuses without a manifest
    table = art.read_table("segments")                                 # checksums verified

Data files are written inside an fsspec transaction (committed together when the block exits
cleanly, discarded on error) under names unique to the writer; the manifest is written after
them, in a transaction of its own (atomic per file). A reader trusts only the manifest, so a
writer killed at any point leaves either no artifact or the previous one, never a mix. With
``if_exists="replace"`` the old files are deleted only after the new manifest is committed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from dressage.schemas.arrow import SCHEMA_VERSION, conform, schema_for, schema_hash
from dressage.staging.manifest import (
    MANIFEST_NAME,
    ArtifactError,
    BlobEntry,
    FileEntry,
    Manifest,
    TableEntry,
)

IfExists = Literal["error", "replace"]


def _producer() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"dressage {version('dressage')}"
    except PackageNotFoundError:
        return "dressage"


def _join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}"


class _HashingFile(io.RawIOBase):
    """Write-through wrapper that counts bytes and computes sha256 while writing."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self._inner.write(view)
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size


@dataclass
class _PendingTable:
    kind: str
    files: list[FileEntry]


class ArtifactWriter:
    """Write one artifact folder; the manifest appears only when the ``with`` block succeeds."""

    def __init__(
        self,
        url: str,
        *,
        metadata: dict[str, Any] | None = None,
        if_exists: IfExists = "error",
        storage_options: dict[str, Any] | None = None,
        compression: str = "zstd",
    ) -> None:
        self.url = url.rstrip("/")
        self.fs: AbstractFileSystem
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        self.metadata = dict(metadata or {})
        self.if_exists = if_exists
        self.compression = compression
        self._token = uuid.uuid4().hex[:12]
        self._tables: dict[str, _PendingTable] = {}
        self._blobs: dict[str, BlobEntry] = {}
        self._previous: Manifest | None = None
        self._txn: Any = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> ArtifactWriter:
        manifest_path = _join(self.root, MANIFEST_NAME)
        if self.fs.exists(manifest_path):
            if self.if_exists == "error":
                raise ArtifactError(
                    f"{self.url} already holds an artifact; pass if_exists='replace' to replace it"
                )
            self._previous = Manifest.parse(self.fs.cat_file(manifest_path), url=self.url)
        self.fs.makedirs(self.root, exist_ok=True)
        self._txn = self.fs.transaction
        self._txn.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        txn, self._txn = self._txn, None
        txn.__exit__(exc_type, exc, tb)  # commits the data files, or discards them on error
        if exc_type is not None:
            return
        manifest = Manifest(
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            producer=_producer(),
            metadata=self.metadata,
            tables={name: self._entry(p) for name, p in self._tables.items()},
            blobs=self._blobs,
        )
        _write_atomic(self.fs, _join(self.root, MANIFEST_NAME), manifest.to_json())
        if self._previous is not None:
            self._delete_unreferenced(self._previous, keep=manifest.all_paths())

    def _entry(self, pending: _PendingTable) -> TableEntry:
        return TableEntry(
            kind=pending.kind,
            schema_version=SCHEMA_VERSION,
            schema_hash=schema_hash(schema_for(pending.kind)),
            rows=sum(f.rows for f in pending.files),
            files=pending.files,
        )

    def _delete_unreferenced(self, previous: Manifest, *, keep: set[str]) -> None:
        for rel in sorted(previous.all_paths() - keep):
            path = _join(self.root, rel)
            if self.fs.exists(path):
                self.fs.rm(path)

    # -- writing --------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if self._txn is None:
            raise RuntimeError("ArtifactWriter is used outside its `with` block")

    def write_table(self, name: str, table: pa.Table, *, kind: str | None = None) -> FileEntry:
        """Append ``table`` (cast to the canonical schema of ``kind``, default ``name``)."""
        self._require_open()
        kind = kind or name
        table = conform(table, kind)
        pending = self._tables.setdefault(name, _PendingTable(kind=kind, files=[]))
        if pending.kind != kind:
            raise ValueError(f"table {name!r} was started as kind {pending.kind!r}, not {kind!r}")
        rel = f"{name}/part-{self._token}-{len(pending.files):05d}.parquet"
        self.fs.makedirs(_join(self.root, name), exist_ok=True)
        with self.fs.open(_join(self.root, rel), "wb") as raw:
            sink = _HashingFile(raw)
            pq.write_table(table, sink, compression=self.compression)
        entry = FileEntry(
            path=rel, rows=table.num_rows, bytes=sink.size, sha256=sink.sha256.hexdigest()
        )
        pending.files.append(entry)
        return entry

    def write_blob(
        self, name: str, data: bytes, *, media_type: str = "application/octet-stream"
    ) -> BlobEntry:
        """Store an opaque file (a report, a plot, a log) under ``blobs/<name>``."""
        self._require_open()
        rel = f"blobs/{self._token}-{name}"
        self.fs.makedirs(_join(self.root, "blobs"), exist_ok=True)
        with self.fs.open(_join(self.root, rel), "wb") as f:
            f.write(data)
        entry = BlobEntry(
            path=rel,
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            media_type=media_type,
        )
        self._blobs[name] = entry
        return entry


def _write_atomic(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Publish one file all at once: a rename on local disks, a single PUT on object stores."""
    if isinstance(fs, LocalFileSystem):
        scratch = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(scratch, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(scratch, path)  # same folder, so a true rename
        return
    with fs.transaction, fs.open(path, "wb") as f:
        f.write(data)


class Artifact:
    """A verified view of an artifact folder (see :func:`open_artifact`)."""

    def __init__(self, url: str, fs: AbstractFileSystem, root: str, manifest: Manifest) -> None:
        self.url, self.fs, self.root, self.manifest = url, fs, root, manifest

    def _read_verified(self, rel: str, size: int, sha256: str) -> bytes:
        path = _join(self.root, rel)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            raise ArtifactError(
                f"{self.url}: {rel} is listed in the manifest but missing"
            ) from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise ArtifactError(
                f"{self.url}: checksum mismatch for {rel} "
                f"(manifest: {size} bytes sha256 {sha256[:12]}…, found {len(data)} bytes)"
            )
        return bytes(data)

    def read_table(self, name: str) -> pa.Table:
        try:
            entry = self.manifest.tables[name]
        except KeyError:
            raise ArtifactError(
                f"{self.url}: no table {name!r}; tables: {sorted(self.manifest.tables)}"
            ) from None
        expected = schema_hash(schema_for(entry.kind))
        if entry.schema_hash != expected:
            raise ArtifactError(
                f"{self.url}: table {name!r} was written with another {entry.kind} schema "
                f"(version {entry.schema_version}, hash {entry.schema_hash[:12]}…)"
            )
        parts = [
            pq.read_table(pa.BufferReader(self._read_verified(f.path, f.bytes, f.sha256)))
            for f in entry.files
        ]
        schema = schema_for(entry.kind)
        if not parts:
            return schema.empty_table()
        table = pa.concat_tables([conform(p, entry.kind) for p in parts])
        if table.num_rows != entry.rows:
            raise ArtifactError(
                f"{self.url}: table {name!r} has {table.num_rows} rows, manifest says {entry.rows}"
            )
        return table

    def read_blob(self, name: str) -> bytes:
        try:
            entry = self.manifest.blobs[name]
        except KeyError:
            raise ArtifactError(
                f"{self.url}: no blob {name!r}; blobs: {sorted(self.manifest.blobs)}"
            ) from None
        return self._read_verified(entry.path, entry.bytes, entry.sha256)

    def verify(self) -> list[str]:
        """Check every listed file's size and checksum; returns the problems found."""
        problems = []
        entries: list[FileEntry | BlobEntry] = [
            f for t in self.manifest.tables.values() for f in t.files
        ]
        entries += list(self.manifest.blobs.values())
        for entry in entries:
            try:
                self._read_verified(entry.path, entry.bytes, entry.sha256)
            except ArtifactError as exc:
                problems.append(str(exc))
        return problems


def open_artifact(url: str, *, storage_options: dict[str, Any] | None = None) -> Artifact:
    """Open an artifact folder; refuses one without a valid manifest."""
    url = url.rstrip("/")
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    path = _join(root, MANIFEST_NAME)
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        raise ArtifactError(
            f"{url}: no {MANIFEST_NAME}; the folder is not a complete artifact"
        ) from None
    return Artifact(url, fs, root, Manifest.parse(raw, url=url))
