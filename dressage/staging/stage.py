"""Stage a finished run's artifacts to the artifact store: verified, manifest last, retry-safe.

    copy_artifact("file:///runs/x/output/artifacts/rollout-00000", "s3://bucket/mopd/x/rollout-00000")
    stage_run("/runs/x/output", "s3://bucket/dressage_mopd/x", metadata={"objective": "mopd"})

``copy_artifact`` verifies every source file against the source manifest while copying, writes
the files in one fsspec transaction, reads them back to verify the destination checksums, and
only then writes the destination manifest (the source's own bytes). A destination that already
holds the same manifest is left as it is; one with data files but no manifest (an interrupted
copy) is overwritten; one that holds a *different* artifact is an error and nothing is replaced.

``stage_run`` copies every ``artifacts/rollout-*`` folder of a job's output this way, then the
run files (``metrics.jsonl``, ``summary.json``, ``curves.png``) under ``run/``, and writes the
run's own manifest at the destination root last: it lists the run files as blobs and every
staged rollout (name → manifest digest) in its metadata. Readers trust a run only with that
manifest, so a failed staging (a read-only root, a lost connection) leaves nothing a reader
accepts, and running it again finishes the job.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from dressage.staging.artifacts import _producer, _write_atomic, open_artifact
from dressage.staging.manifest import MANIFEST_NAME, ArtifactError, BlobEntry, Manifest

__all__ = ["RUN_FILES", "StagedRun", "StagingError", "copy_artifact", "stage_run"]

CHUNK = 8 << 20
RUN_FILES: Mapping[str, str] = {
    "metrics.jsonl": "application/jsonl",
    "summary.json": "application/json",
    "curves.png": "image/png",
}
"""Run-level files staged as blobs when the job's output holds them."""


class StagingError(RuntimeError):
    """Staging could not finish; the message names the source, the destination and the cause."""


@dataclass(frozen=True)
class _File:
    rel: str
    """Path under the destination root (and under the source root unless ``src_rel`` is set)."""
    size: int
    sha256: str
    src_rel: str | None = None


@dataclass
class StagedRun:
    url: str
    rollouts: list[str]
    files_copied: int = 0
    already_staged: bool = False
    blobs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "rollouts": list(self.rollouts),
            "files_copied": self.files_copied,
            "already_staged": self.already_staged,
            "blobs": list(self.blobs),
        }


def _join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}"


def _url(url: str) -> str:
    return url.rstrip("/")


# -- one artifact -------------------------------------------------------------------------------


def copy_artifact(
    src_url: str,
    dst_url: str,
    *,
    src_options: Mapping[str, Any] | None = None,
    dst_options: Mapping[str, Any] | None = None,
) -> int:
    """Copy one artifact folder; returns the number of files copied (0: already there)."""
    src_url, dst_url = _url(src_url), _url(dst_url)
    try:
        src = open_artifact(src_url, storage_options=dict(src_options or {}))
        raw_manifest = bytes(src.fs.cat_file(_join(src.root, MANIFEST_NAME)))
    except ArtifactError as exc:
        raise StagingError(f"cannot stage {src_url}: {exc}") from None
    dst_fs, dst_root = fsspec.core.url_to_fs(dst_url, **dict(dst_options or {}))
    existing = _manifest_at(dst_fs, dst_root, dst_url)
    if existing is not None:
        if existing.manifest_sha256 != src.manifest.manifest_sha256:
            raise StagingError(
                f"{dst_url} already holds a different artifact (manifest "
                f"{existing.manifest_sha256[:12]}…, source {src.manifest.manifest_sha256[:12]}…); "
                "nothing was replaced"
            )
        problems = open_artifact(dst_url, storage_options=dict(dst_options or {})).verify()
        if problems:
            raise StagingError(f"{dst_url} holds this artifact but fails verification: {problems}")
        return 0
    files = [
        _File(f.path, f.bytes, f.sha256) for t in src.manifest.tables.values() for f in t.files
    ]
    files += [_File(b.path, b.bytes, b.sha256) for b in src.manifest.blobs.values()]
    _copy_files(src.fs, src.root, dst_fs, dst_root, files, src_url=src_url, dst_url=dst_url)
    _publish(dst_fs, dst_root, raw_manifest, files, dst_url=dst_url)
    return len(files)


def _manifest_at(fs: AbstractFileSystem, root: str, url: str) -> Manifest | None:
    try:
        raw = fs.cat_file(_join(root, MANIFEST_NAME))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StagingError(f"cannot read {url}/{MANIFEST_NAME}: {exc}") from exc
    try:
        return Manifest.parse(raw, url=url)
    except ArtifactError as exc:
        raise StagingError(
            f"{url} holds an unreadable manifest; nothing was replaced: {exc}"
        ) from None


def _copy_files(
    src_fs: AbstractFileSystem,
    src_root: str,
    dst_fs: AbstractFileSystem,
    dst_root: str,
    files: Iterable[_File],
    *,
    src_url: str,
    dst_url: str,
) -> None:
    """Copy with on-the-fly checksums; the transaction publishes all files or none."""
    try:
        dst_fs.makedirs(dst_root, exist_ok=True)
        with dst_fs.transaction:
            for f in files:
                parent = _join(dst_root, f.rel).rsplit("/", 1)[0]
                dst_fs.makedirs(parent, exist_ok=True)
                with src_fs.open(_join(src_root, f.src_rel or f.rel), "rb") as r:
                    with dst_fs.open(_join(dst_root, f.rel), "wb") as w:
                        size, digest = _pump(r, w)
                if (size, digest) != (f.size, f.sha256):
                    raise StagingError(
                        f"{src_url}/{f.src_rel or f.rel} does not match its manifest ({size} "
                        f"bytes, sha256 {digest[:12]}…; manifest {f.size} bytes, {f.sha256[:12]}…)"
                    )
    except StagingError:
        raise
    except (OSError, NotImplementedError, ValueError) as exc:
        raise StagingError(f"cannot write to {dst_url}: {type(exc).__name__}: {exc}") from exc


def _pump(reader: Any, writer: Any | None) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    while chunk := reader.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if writer is not None:
            writer.write(chunk)
    return size, digest.hexdigest()


def _publish(
    fs: AbstractFileSystem, root: str, manifest: bytes, files: list[_File], *, dst_url: str
) -> None:
    """Verify what landed at the destination, then write the manifest; undo the files if not."""
    try:
        for f in files:
            with fs.open(_join(root, f.rel), "rb") as r:
                size, digest = _pump(r, None)
            if (size, digest) != (f.size, f.sha256):
                raise StagingError(
                    f"{dst_url}/{f.rel}: checksum mismatch after copying ({size} bytes, "
                    f"sha256 {digest[:12]}…; expected {f.size} bytes, {f.sha256[:12]}…)"
                )
        _write_atomic(fs, _join(root, MANIFEST_NAME), manifest)
    except (StagingError, OSError) as exc:
        for f in files:  # no manifest, so nothing here is trusted; do not leave it lying around
            try:
                fs.rm(_join(root, f.rel))
            except OSError:
                pass
        if isinstance(exc, StagingError):
            raise
        raise StagingError(f"cannot write the manifest of {dst_url}: {exc}") from exc


# -- a whole run ----------------------------------------------------------------------------------


def stage_run(
    output_dir: str,
    dst_url: str,
    *,
    metadata: Mapping[str, Any] | None = None,
    dst_options: Mapping[str, Any] | None = None,
) -> StagedRun:
    """Stage a job's ``output_dir`` (path or URL) to ``dst_url``; see the module docstring."""
    dst_url = _url(dst_url)
    src_fs, src_root = fsspec.core.url_to_fs(str(output_dir))
    rollouts = _rollouts(src_fs, src_root, str(output_dir))
    run_files = _run_files(src_fs, src_root)
    expected = Manifest(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        producer=_producer(),
        metadata={**dict(metadata or {}), "rollouts": rollouts},
        blobs={
            name: BlobEntry(path=f.rel, bytes=f.size, sha256=f.sha256, media_type=RUN_FILES[name])
            for name, f in run_files.items()
        },
    )
    dst_fs, dst_root = fsspec.core.url_to_fs(dst_url, **dict(dst_options or {}))
    existing = _manifest_at(dst_fs, dst_root, dst_url)
    staged = StagedRun(dst_url, sorted(rollouts), blobs=sorted(run_files))
    if existing is not None:
        if _content(existing) != _content(expected):
            raise StagingError(
                f"{dst_url} already holds a different run (rollouts or run files differ); "
                "nothing was replaced"
            )
        staged.already_staged = True
        return staged
    for name in sorted(rollouts):
        staged.files_copied += copy_artifact(
            f"{_src_url(output_dir)}/artifacts/{name}",
            f"{dst_url}/{name}",
            dst_options=dst_options,
        )
    files = list(run_files.values())
    _copy_files(src_fs, src_root, dst_fs, dst_root, files, src_url=str(output_dir), dst_url=dst_url)
    _publish(dst_fs, dst_root, expected.to_json(), files, dst_url=dst_url)
    staged.files_copied += len(files)
    return staged


def _src_url(output_dir: str) -> str:
    text = str(output_dir).rstrip("/")
    return text if "://" in text else f"file://{text}"


def _rollouts(fs: AbstractFileSystem, root: str, where: str) -> dict[str, str]:
    """Every ``artifacts/<name>`` folder and its manifest digest; all must be complete."""
    base = _join(root, "artifacts")
    try:
        entries = fs.ls(base, detail=True, refresh=True)
    except FileNotFoundError:
        raise StagingError(f"{where}/artifacts does not exist: the job wrote no artifact") from None
    folders = sorted(
        e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory"
    )
    if not folders:
        raise StagingError(f"{where}/artifacts holds no artifact folder: nothing to stage")
    out: dict[str, str] = {}
    for name in folders:
        manifest = _manifest_at(fs, _join(base, name), f"{where}/artifacts/{name}")
        if manifest is None:
            raise StagingError(
                f"{where}/artifacts/{name} has no {MANIFEST_NAME}: the job left an incomplete "
                "artifact, so the run is not staged"
            )
        out[name] = manifest.manifest_sha256
    return out


def _run_files(fs: AbstractFileSystem, root: str) -> dict[str, _File]:
    found: dict[str, _File] = {}
    for name in RUN_FILES:
        path = _join(root, name)
        if fs.exists(path):
            with fs.open(path, "rb") as r:
                size, digest = _pump(r, None)
            found[name] = _File(f"run/{name}", size, digest, src_rel=name)
    return found


def _content(manifest: Manifest) -> dict[str, Any]:
    """What makes two run manifests the same run (not when or by whom they were written)."""
    return manifest.model_dump(mode="json", exclude={"created_at", "producer", "manifest_sha256"})
