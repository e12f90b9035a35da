"""The data contracts: one canonical Arrow schema and one pandera model per table.

Tables: ``steps`` (proxy calls), ``segments``, ``samples`` (slime ``Sample`` rows),
``train_data`` (slime train_data, one row per sample) and ``manifest_files``.
"""

from dressage.schemas.arrow import (
    SCHEMA_VERSION,
    SCHEMAS,
    TABLE_KINDS,
    TableKind,
    conform,
    schema_for,
    schema_hash,
)
from dressage.schemas.models import MODELS
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
from dressage.schemas.validate import (
    Failure,
    SchemaValidationError,
    ValidationReport,
    schema,
    validate_table,
)

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
