"""The artifact manifest: what a folder holds, written last, trusted only when it verifies.

A manifest lists every data file of every table (path, rows, bytes, sha256) with the table's
schema version and hash, plus opaque blobs (reports, curves, logs). Its own digest covers every
other field, so a truncated or edited manifest is refused like a missing one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MANIFEST_NAME = "_MANIFEST.json"
FORMAT = "dressage-artifact"
FORMAT_VERSION = 1

_SHA256 = r"^[0-9a-f]{64}$"


class ArtifactError(RuntimeError):
    """An artifact folder that cannot be trusted: no manifest, a bad manifest, a bad checksum."""


def _safe_relative(path: str) -> str:
    parts = path.split("/")
    if path.startswith("/") or not path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path {path!r} must be relative, without '.', '..' or empty parts")
    return path


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)

    _check_path = field_validator("path")(_safe_relative)


class BlobEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)
    media_type: str = "application/octet-stream"

    _check_path = field_validator("path")(_safe_relative)


class TableEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    schema_version: int
    schema_hash: str = Field(pattern=_SHA256)
    rows: int = Field(ge=0)
    files: list[FileEntry]


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["dressage-artifact"] = "dressage-artifact"
    format_version: int = FORMAT_VERSION
    created_at: str
    producer: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    tables: dict[str, TableEntry] = Field(default_factory=dict)
    blobs: dict[str, BlobEntry] = Field(default_factory=dict)
    manifest_sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")

    def digest(self) -> str:
        body = self.model_dump(mode="json", exclude={"manifest_sha256"})
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def sealed(self) -> Manifest:
        return self.model_copy(update={"manifest_sha256": self.digest()})

    def to_json(self) -> bytes:
        return self.sealed().model_dump_json(indent=2).encode()

    @classmethod
    def parse(cls, raw: bytes, *, url: str) -> Manifest:
        try:
            manifest = cls.model_validate_json(raw)
        except ValidationError as exc:
            raise ArtifactError(f"{url}: invalid manifest: {exc}") from None
        if manifest.format_version != FORMAT_VERSION:
            raise ArtifactError(
                f"{url}: manifest format_version {manifest.format_version} is not {FORMAT_VERSION}"
            )
        if manifest.manifest_sha256 != manifest.digest():
            raise ArtifactError(f"{url}: manifest checksum mismatch (edited or truncated)")
        return manifest

    def all_paths(self) -> set[str]:
        paths = {f.path for t in self.tables.values() for f in t.files}
        return paths | {b.path for b in self.blobs.values()}
