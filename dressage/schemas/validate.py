"""Validate a table against its pandera model and report every failure as one JSON document.

    from dressage.schemas import validate_table
    report = validate_table("segments", arrow_table, vocab_size=248077)
    if not report.ok:
        print(report.to_json())          # every failing check, column, row and id

Validation is lazy in pandera's sense (all checks run, all failures are collected) and always
runs on a collected polars frame, so data checks are never skipped (pandera checks only the
schema of a LazyFrame).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pandera.errors
import pandera.polars as pa
import polars as pl
import pyarrow as pa_arrow

from dressage.schemas.arrow import ID_COLUMNS, schema_for
from dressage.schemas.models import MODELS, TOKEN_COLUMNS, ids_below

MAX_LISTED = 10_000
"""Rows listed per failure; the count is always exact."""


@dataclass
class Failure:
    check: str
    column: str | None
    count: int
    rows: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    message: str = ""


@dataclass
class ValidationReport:
    table: str
    rows: int
    failures: list[Failure] = field(default_factory=list)
    source: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "source": self.source,
            "rows": self.rows,
            "ok": self.ok,
            "failures": [asdict(f) for f in self.failures],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def raise_for_failures(self) -> None:
        if not self.ok:
            raise SchemaValidationError(self)


class SchemaValidationError(ValueError):
    """Raised by :meth:`ValidationReport.raise_for_failures`; carries the report."""

    def __init__(self, report: ValidationReport) -> None:
        self.report = report
        where = f" ({report.source})" if report.source else ""
        names = ", ".join(
            f"{f.check}[{f.column}] x{f.count}" if f.column else f"{f.check} x{f.count}"
            for f in report.failures
        )
        super().__init__(f"{report.table}{where}: {len(report.failures)} failing checks: {names}")


def schema(kind: str, *, vocab_size: int | None = None) -> pa.DataFrameSchema:
    """The pandera schema of ``kind``, with the vocabulary check when ``vocab_size`` is known."""
    try:
        model = MODELS[kind]
    except KeyError:
        raise ValueError(f"unknown table kind {kind!r}; expected one of {sorted(MODELS)}") from None
    result = model.to_schema()
    if vocab_size is not None:
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        for column in TOKEN_COLUMNS[kind]:
            check = pa.Check(
                lambda data, v=vocab_size: data.lazyframe.select(ids_below(data.key, v)),
                name=f"token_ids_below_vocab_size({vocab_size})",
            )
            existing = list(result.columns[column].checks)
            result = result.update_column(column, checks=[*existing, check])
    return result


def validate_table(
    kind: str,
    data: pa_arrow.Table | pl.DataFrame,
    *,
    vocab_size: int | None = None,
    source: str | None = None,
) -> ValidationReport:
    """Run every rule of ``kind`` over ``data``; never raises for bad data, returns the report."""
    schema_for(kind)  # fail fast on an unknown kind
    frame = data if isinstance(data, pl.DataFrame) else pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    report = ValidationReport(table=kind, rows=frame.height, source=source)
    try:
        schema(kind, vocab_size=vocab_size).validate(frame, lazy=True)
    except pandera.errors.SchemaErrors as exc:
        report.failures = _failures(kind, frame, exc.failure_cases)
    return report


def _failures(kind: str, frame: pl.DataFrame, cases: pl.DataFrame) -> list[Failure]:
    out: list[Failure] = []
    id_columns = [c for c in ID_COLUMNS[kind] if c in frame.columns]  # type: ignore[index]
    keyed = cases.select("check", "column", "index", "failure_case")
    for (check, column), group in keyed.group_by(["check", "column"], maintain_order=True):
        rows = sorted({int(i) for i in group["index"].drop_nulls().to_list()})
        failure = Failure(check=str(check), column=_column(kind, column), count=len(rows))
        if rows:
            listed = rows[:MAX_LISTED]
            failure.rows = listed
            failure.ids = _ids(frame, id_columns, listed)
            failure.message = f"{failure.count} of {frame.height} rows fail {check}"
        else:  # a schema-level failure: missing column, wrong dtype, ...
            detail = ", ".join(str(v) for v in group["failure_case"].to_list()[:5])
            failure.count = group.height
            failure.message = f"{check}: {detail}"
        out.append(failure)
    return out


def _column(kind: str, column: object) -> str | None:
    name = None if column is None else str(column)
    # frame-wide checks report the model's name as their column
    return None if name in (None, MODELS[kind].__name__) else name


def _ids(frame: pl.DataFrame, id_columns: list[str], rows: list[int]) -> list[str]:
    if not id_columns:
        return [str(r) for r in rows]
    picked = frame.select(id_columns)[rows]
    return [
        "/".join(f"{c}={v}" for c, v in zip(id_columns, values, strict=True))
        for values in picked.iter_rows()
    ]
