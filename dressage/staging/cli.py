"""``dressage artifacts validate URL`` and ``dressage artifacts show URL``."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from dressage.commands import command_parser
from dressage.staging.artifacts import open_artifact
from dressage.staging.manifest import ArtifactError
from dressage.staging.validation import validate_artifact


def validate_main(argv: Sequence[str]) -> int:
    parser = command_parser(
        "python -m dressage.staging.cli validate",
        description="Verify an artifact's manifest, checksums and table schemas. "
        "Exit 0 when valid; otherwise print the JSON report and exit 1.",
    )
    parser.add_argument("url", help="artifact folder URL (file://, memory://, s3://, gs://, path)")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="check that every token id is below it (default: no check)",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing when valid")
    args = parser.parse_args(list(argv))
    report = validate_artifact(args.url, vocab_size=args.vocab_size)
    if report["ok"]:
        if not args.quiet:
            rows = {name: t["rows"] for name, t in report["tables"].items()}
            print(f"ok: {args.url} {rows}")
        return 0
    print(json.dumps(report, indent=2), file=sys.stdout)
    return 1


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def show_main(argv: Sequence[str]) -> int:
    parser = command_parser(
        "python -m dressage.staging.cli show", description="Summarise an artifact folder."
    )
    parser.add_argument("url", help="artifact folder URL (file://, memory://, s3://, gs://, path)")
    args = parser.parse_args(list(argv))
    try:
        artifact = open_artifact(args.url)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    m = artifact.manifest
    print(f"artifact  {artifact.url}")
    print(f"created   {m.created_at} by {m.producer}")
    for key, value in sorted(m.metadata.items()):
        print(f"  {key}: {value}")
    print("tables:")
    for name, t in sorted(m.tables.items()):
        size = sum(f.bytes for f in t.files)
        print(
            f"  {name:<16} kind={t.kind:<14} rows={t.rows:<8} files={len(t.files):<3} "
            f"{_human(size)}  schema v{t.schema_version} {t.schema_hash[:12]}"
        )
    if m.blobs:
        print("blobs:")
        for name, b in sorted(m.blobs.items()):
            print(f"  {name:<24} {b.media_type:<24} {_human(b.bytes)}")
    return 0
