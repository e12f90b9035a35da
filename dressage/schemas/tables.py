"""Records <-> canonical Arrow tables, column by column.

Each ``*_to_table`` builds columns straight from the records (no per-row dicts) and returns a
table with exactly the canonical schema; each ``*_from_table`` is its inverse. Log-probs are
stored as float32, so a float round-trips exactly when it is float32-representable (the engine's
log-probs are); everything else round-trips exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from dressage.schemas.arrow import (
    SAMPLE_SCHEMA,
    SEGMENT_SCHEMA,
    STEP_SCHEMA,
    TRAIN_DATA_SCHEMA,
    conform,
)
from dressage.trajectory import Segment, StepRecord
from dressage.types import Sample


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _build(schema: pa.Schema, columns: dict[str, list[Any]]) -> pa.Table:
    arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _columns(table: pa.Table) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _gather(records: Sequence[Any], names: Sequence[str]) -> dict[str, list[Any]]:
    return {name: [getattr(r, name) for r in records] for name in names}


# -- steps ----------------------------------------------------------------------------------------

_STEP_PLAIN = [f.name for f in STEP_SCHEMA if not f.name.endswith("_json")]


def steps_to_table(steps: Sequence[StepRecord]) -> pa.Table:
    cols = _gather(steps, _STEP_PLAIN)
    cols["messages_json"] = [_dumps(s.messages) for s in steps]
    cols["extra_json"] = [_dumps(s.extra) for s in steps]
    return _build(STEP_SCHEMA, cols)


def steps_from_table(table: pa.Table) -> list[StepRecord]:
    cols = _columns(conform(table, "steps"))
    messages = [json.loads(t) for t in cols.pop("messages_json")]
    extra = [json.loads(t) for t in cols.pop("extra_json")]
    return [
        StepRecord(**{k: v[i] for k, v in cols.items()}, messages=messages[i], extra=extra[i])
        for i in range(table.num_rows)
    ]


# -- segments -------------------------------------------------------------------------------------

_SEGMENT_PLAIN = [f.name for f in SEGMENT_SCHEMA if not f.name.endswith("_json")]


def segments_to_table(segments: Sequence[Segment]) -> pa.Table:
    cols = _gather(segments, _SEGMENT_PLAIN)
    cols["messages_json"] = [_dumps(s.messages) for s in segments]
    cols["extra_info_json"] = [_dumps(s.extra_info) for s in segments]
    return _build(SEGMENT_SCHEMA, cols)


def segments_from_table(table: pa.Table) -> list[Segment]:
    cols = _columns(conform(table, "segments"))
    messages = [json.loads(t) for t in cols.pop("messages_json")]
    extra = [json.loads(t) for t in cols.pop("extra_info_json")]
    return [
        Segment(**{k: v[i] for k, v in cols.items()}, messages=messages[i], extra_info=extra[i])
        for i in range(table.num_rows)
    ]


# -- samples --------------------------------------------------------------------------------------

_SAMPLE_PLAIN = [
    "index",
    "group_index",
    "rollout_id",
    "session_id",
    "tokens",
    "response",
    "response_length",
    "label",
    "loss_mask",
    "rollout_log_probs",
    "teacher_log_probs",
    "weight_versions",
    "remove_sample",
    "generate_function_path",
    "custom_rm_path",
    "non_generation_time",
]


def _reward_columns(sample: Sample) -> tuple[float | None, str | None]:
    reward = sample.reward
    if reward is None:
        return None, None
    if isinstance(reward, dict):
        return None, _dumps(reward)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise TypeError(
            f"sample index={sample.index}: reward must be a number, a dict or None, "
            f"not {type(reward).__name__}"
        )
    return float(reward), None


def samples_to_table(samples: Sequence[Sample]) -> pa.Table:
    cols = _gather(samples, _SAMPLE_PLAIN)
    rewards = [_reward_columns(s) for s in samples]
    cols["reward"] = [r for r, _ in rewards]
    cols["reward_json"] = [j for _, j in rewards]
    cols["prompt_json"] = [_dumps(s.prompt) for s in samples]
    cols["status"] = [s.status.value for s in samples]
    cols["metadata_json"] = [_dumps(s.metadata) for s in samples]
    cols["train_metadata_json"] = [
        None if s.train_metadata is None else _dumps(s.train_metadata) for s in samples
    ]
    return _build(SAMPLE_SCHEMA, cols)


def samples_from_table(table: pa.Table) -> list[Sample]:
    cols = _columns(conform(table, "samples"))
    out = []
    for i in range(table.num_rows):
        row = {k: cols[k][i] for k in _SAMPLE_PLAIN}
        reward_json = cols["reward_json"][i]
        row["reward"] = json.loads(reward_json) if reward_json is not None else cols["reward"][i]
        row["prompt"] = json.loads(cols["prompt_json"][i])
        row["status"] = Sample.Status(cols["status"][i])
        row["metadata"] = json.loads(cols["metadata_json"][i])
        row["train_metadata"] = _loads_or_none(cols["train_metadata_json"][i])
        out.append(Sample(**row))
    return out


# -- train data -----------------------------------------------------------------------------------

# Keys a batch may lack, stored as nulls: slime's converter emits rollout_log_probs and
# teacher_log_probs only when the samples carry them (docs/slime.md §3.2), the MOPD converter
# adds prompt (teacher ids) for MOPD only, and raw_reward is kept optional for train_data
# written by other converters.
_OPTIONAL_TRAIN_KEYS = {"raw_reward", "rollout_log_probs", "teacher_log_probs", "prompt"}


def train_data_to_table(train_data: dict[str, Any]) -> pa.Table:
    """One row per sample from slime's train_data dict (extra keys are not stored)."""
    n = len(train_data["tokens"])
    cols: dict[str, list[Any]] = {}
    for f in TRAIN_DATA_SCHEMA:
        values = train_data.get(f.name)
        if values is None:
            if f.name not in _OPTIONAL_TRAIN_KEYS and f.name != "source_names":
                raise KeyError(f"train_data is missing the key {f.name!r}")
            values = [None] * n
        values = _plain(values)
        if len(values) != n:
            raise ValueError(f"train_data[{f.name!r}] has {len(values)} entries, tokens has {n}")
        cols[f.name] = values
    return _build(TRAIN_DATA_SCHEMA, cols)


def train_data_from_table(table: pa.Table) -> dict[str, list[Any]]:
    cols = _columns(conform(table, "train_data"))
    return {k: v for k, v in cols.items() if not all(x is None for x in v) or not v}


def _plain(values: Any) -> list[Any]:
    """Tensors and numpy arrays (slime tensorises some keys) to Python lists."""
    tolist: Callable[[], list[Any]] | None = getattr(values, "tolist", None)
    if tolist is not None:
        return tolist()
    return [v.tolist() if hasattr(v, "tolist") else v for v in values]
