"""pandera checks over a staged run: one table kind across all its rollouts, one JSON report.

    report = check_run_tables("file:///runs/artifacts/dressage_mopd/x", "train_data",
                              vocab_size=248_320)
    report["ok"], report["report_url"]     # .../checks/train_data.json, written either way

Every rollout listed in the run manifest is opened through its own manifest (checksums
verified) and its table validated with :func:`dressage.schemas.validate_table`. A rollout that
lacks the table, or whose manifest no longer matches the digest the run recorded, is a failure
too. The report lists every failing check with its column, row count, rows and ids.
"""

from __future__ import annotations

import json
from typing import Any

import fsspec

from dressage.schemas.validate import validate_table
from dressage.staging.artifacts import _write_atomic, open_artifact
from dressage.staging.manifest import ArtifactError

__all__ = ["check_run_tables", "describe_failures"]


def check_run_tables(
    run_url: str,
    kind: str,
    *,
    vocab_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate table ``kind`` of every rollout of the staged run at ``run_url``."""
    run_url = run_url.rstrip("/")
    report: dict[str, Any] = {
        "run": run_url,
        "table": kind,
        "vocab_size": vocab_size,
        "ok": False,
        "rows": 0,
        "errors": [],
        "rollouts": {},
    }
    try:
        run = open_artifact(run_url, storage_options=storage_options)
    except ArtifactError as exc:
        report["errors"].append(str(exc))
        return _store(report, run_url, kind, storage_options)
    rollouts: dict[str, str] = dict(run.manifest.metadata.get("rollouts") or {})
    if not rollouts:
        report["errors"].append(f"{run_url}: the run manifest lists no rollout")
    for name, digest in sorted(rollouts.items()):
        url = f"{run_url}/{name}"
        try:
            artifact = open_artifact(url, storage_options=storage_options)
            if artifact.manifest.manifest_sha256 != digest:
                raise ArtifactError(f"{url}: manifest differs from the one the run staged")
            table = artifact.read_table(kind)
        except ArtifactError as exc:
            report["errors"].append(str(exc))
            continue
        result = validate_table(kind, table, vocab_size=vocab_size, source=f"{url}#{kind}")
        report["rollouts"][name] = result.to_dict()
        report["rows"] += result.rows
    checked = report["rollouts"].values()
    report["ok"] = not report["errors"] and all(r["ok"] for r in checked)
    return _store(report, run_url, kind, storage_options)


def _store(
    report: dict[str, Any], run_url: str, kind: str, storage_options: dict[str, Any] | None
) -> dict[str, Any]:
    """Write the report beside the artifacts (``<run>/checks/<kind>.json``)."""
    url = f"{run_url}/checks/{kind}.json"
    report["report_url"] = url
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    _write_atomic(fs, path, json.dumps(report, indent=2).encode())
    return report


def describe_failures(report: dict[str, Any], *, limit: int = 10) -> str:
    """A few readable lines: which rollout, check and column failed, how often, first ids."""
    lines = [str(e) for e in report.get("errors", [])]
    for name, result in sorted(report.get("rollouts", {}).items()):
        for f in result.get("failures", []):
            column = f"[{f['column']}]" if f.get("column") else ""
            ids = ", ".join(f.get("ids", [])[:3])
            lines.append(f"{name}: {f['check']}{column} fails {f['count']} row(s); first: {ids}")
    more = len(lines) - limit
    return "\n".join(lines[:limit] + ([f"... and {more} more"] if more > 0 else []))
