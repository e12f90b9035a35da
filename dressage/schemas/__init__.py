"""The data contracts: one canonical Arrow schema and one pandera model per table.

Tables: ``steps`` (proxy calls), ``segments``, ``samples`` (slime ``Sample`` rows),
``train_data`` (slime train_data, one row per sample) and ``manifest_files``.

The pandera side (``MODELS``, ``validate_table`` and the rest of
:mod:`~dressage.schemas.validate`) is imported when first named: the proxy builds Arrow tables
from this package and runs where polars and pandera need not be installed.
"""

from typing import TYPE_CHECKING, Any

from dressage.schemas.arrow import (
    SCHEMA_VERSION,
    SCHEMAS,
    TABLE_KINDS,
    TableKind,
    conform,
    schema_for,
    schema_hash,
)
from dressage.schemas.tables import (
    samples_from_table,
    samples_to_table,
    segments_from_table,
    segments_to_table,
    steps_from_table,
    steps_to_table,
    train_data_from_table,
    train_data_to_table,
)

if TYPE_CHECKING:
    from dressage.schemas.models import MODELS
    from dressage.schemas.validate import (
        Failure,
        SchemaValidationError,
        ValidationReport,
        schema,
        validate_table,
    )

_LAZY = {
    "MODELS": "dressage.schemas.models",
    "Failure": "dressage.schemas.validate",
    "SchemaValidationError": "dressage.schemas.validate",
    "ValidationReport": "dressage.schemas.validate",
    "schema": "dressage.schemas.validate",
    "validate_table": "dressage.schemas.validate",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "MODELS",
    "SCHEMAS",
    "SCHEMA_VERSION",
    "TABLE_KINDS",
    "Failure",
    "SchemaValidationError",
    "TableKind",
    "ValidationReport",
    "conform",
    "samples_from_table",
    "samples_to_table",
    "schema",
    "schema_for",
    "schema_hash",
    "segments_from_table",
    "segments_to_table",
    "steps_from_table",
    "steps_to_table",
    "train_data_from_table",
    "train_data_to_table",
    "validate_table",
]
