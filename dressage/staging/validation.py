"""Validate a whole artifact: its manifest, every checksum, and every table's data rules."""

from __future__ import annotations

from typing import Any

from dressage.schemas.validate import validate_table
from dressage.staging.artifacts import open_artifact
from dressage.staging.manifest import ArtifactError


def validate_artifact(
    url: str,
    *,
    vocab_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One JSON-able report: ``{"url", "ok", "errors": [...], "tables": {name: report}}``."""
    report: dict[str, Any] = {"url": url, "ok": False, "errors": [], "tables": {}}
    try:
        artifact = open_artifact(url, storage_options=storage_options)
    except ArtifactError as exc:
        report["errors"].append(str(exc))
        return report
    report["errors"].extend(artifact.verify())
    for name, entry in artifact.manifest.tables.items():
        try:
            table = artifact.read_table(name)
        except ArtifactError as exc:
            report["errors"].append(str(exc))
            continue
        source = f"{url}#{name}"
        result = validate_table(entry.kind, table, vocab_size=vocab_size, source=source)
        report["tables"][name] = result.to_dict()
    tables_ok = all(t["ok"] for t in report["tables"].values())
    report["ok"] = not report["errors"] and tables_ok
    return report
