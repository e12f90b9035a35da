"""The canonical Arrow schema of every table that crosses a process boundary.

One schema per table; writers cast to it before every write, so files from different producers
(polars writes ``large_list``, pyarrow ``list``) never disagree. Column names mirror slime's
``Sample`` fields and train_data keys, so the hand-off into slime is a rename-free cast.

Token ids are ``int32`` (vocabularies stay far below 2**31), masks ``int8``, log-probs
``float32`` (slime tensorises them as float32). Free-form nested data (messages, metadata,
extra info) is stored as JSON text.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import pyarrow as pa

TableKind = Literal["steps", "segments", "samples", "train_data", "manifest_files"]
TABLE_KINDS: tuple[TableKind, ...] = (
    "steps",
    "segments",
    "samples",
    "train_data",
    "manifest_files",
)

SCHEMA_VERSION = 1

_ids = pa.list_(pa.int32())
_mask = pa.list_(pa.int8())
_logprobs = pa.list_(pa.float32())

STEP_SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("step_index", pa.int32(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("prefix_length", pa.int32(), nullable=False),
        pa.field("prompt_delta_ids", _ids, nullable=False),
        pa.field("output_ids", _ids, nullable=False),
        pa.field("output_logprobs", _logprobs, nullable=False),
        pa.field("output_versions", _ids, nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("boundary_reason", pa.string()),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("started_at", pa.float64(), nullable=False),
        pa.field("ended_at", pa.float64(), nullable=False),
        pa.field("messages_json", pa.string(), nullable=False),
        pa.field("extra_json", pa.string(), nullable=False),
    ]
)

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("tokens", _ids, nullable=False),
        pa.field("full_loss_mask", _mask, nullable=False),
        pa.field("full_logprobs", _logprobs, nullable=False),
        pa.field("full_versions", _ids),
        pa.field("prompt_length", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("messages_json", pa.string(), nullable=False),
        pa.field("extra_info_json", pa.string(), nullable=False),
    ]
)

SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("index", pa.int64()),
        pa.field("group_index", pa.int64()),
        pa.field("rollout_id", pa.int64()),
        pa.field("session_id", pa.string()),
        pa.field("prompt_json", pa.string(), nullable=False),
        pa.field("tokens", _ids, nullable=False),
        pa.field("response", pa.string(), nullable=False),
        pa.field("response_length", pa.int32(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("reward_json", pa.string()),
        pa.field("loss_mask", _mask),
        pa.field("rollout_log_probs", _logprobs),
        pa.field("teacher_log_probs", _logprobs),
        pa.field("weight_versions", pa.list_(pa.string()), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("remove_sample", pa.bool_(), nullable=False),
        pa.field("metadata_json", pa.string(), nullable=False),
        pa.field("train_metadata_json", pa.string()),
        pa.field("generate_function_path", pa.string()),
        pa.field("custom_rm_path", pa.string()),
        pa.field("non_generation_time", pa.float64(), nullable=False),
    ]
)

# One row per sample; columns are slime's train_data keys (docs/slime.md §3.2).
TRAIN_DATA_SCHEMA = pa.schema(
    [
        pa.field("tokens", _ids, nullable=False),
        pa.field("response_lengths", pa.int32(), nullable=False),
        pa.field("rewards", pa.float64(), nullable=False),
        pa.field("raw_reward", pa.float64()),
        pa.field("truncated", pa.int8(), nullable=False),
        pa.field("sample_indices", pa.int64()),
        pa.field("rollout_ids", pa.int64(), nullable=False),
        pa.field("loss_masks", _mask, nullable=False),
        pa.field("rollout_mask_sums", pa.float64(), nullable=False),
        pa.field("rollout_log_probs", _logprobs),
        pa.field("teacher_log_probs", _logprobs),
        pa.field("prompt", pa.string()),
        pa.field("source_names", pa.string()),
    ]
)

MANIFEST_FILES_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
    ]
)

SCHEMAS: dict[TableKind, pa.Schema] = {
    "steps": STEP_SCHEMA,
    "segments": SEGMENT_SCHEMA,
    "samples": SAMPLE_SCHEMA,
    "train_data": TRAIN_DATA_SCHEMA,
    "manifest_files": MANIFEST_FILES_SCHEMA,
}

# Columns that identify a row in error reports, per table.
ID_COLUMNS: dict[TableKind, tuple[str, ...]] = {
    "steps": ("session_id", "step_index"),
    "segments": ("session_id", "segment_index"),
    "samples": ("index", "session_id"),
    "train_data": ("sample_indices", "rollout_ids"),
    "manifest_files": ("path",),
}


def schema_for(kind: str) -> pa.Schema:
    try:
        return SCHEMAS[kind]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown table kind {kind!r}; expected one of {TABLE_KINDS}") from None


def schema_hash(schema: pa.Schema) -> str:
    """A stable digest of names, types and nullability (metadata ignored)."""
    text = "\n".join(f"{f.name}:{f.type}:{int(f.nullable)}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()


def conform(table: pa.Table, kind: str) -> pa.Table:
    """Cast ``table`` to the canonical schema of ``kind``: same columns, order and types.

    Raises ValueError naming missing or unexpected columns, or the column whose cast failed.
    """
    schema = schema_for(kind)
    have, want = set(table.column_names), set(schema.names)
    if have != want:
        missing, extra = sorted(want - have), sorted(have - want)
        raise ValueError(
            f"{kind}: columns differ from the schema: missing {missing}, extra {extra}"
        )
    columns = []
    for field in schema:
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"{kind}.{field.name}: cannot cast {column.type} to {field.type}: {exc}"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)
