"""pandera (polars) models: the data rules of every table, one model per table.

Every rule is a native polars expression over list columns (no Python per cell), so a batch of
10,000 segments of 8,192 tokens validates in a fraction of a second. Rules that need a value
known only at run time (the vocabulary size) are added by :func:`dressage.schemas.validate.schema`.

Use them as pandera models (``SegmentModel.validate(df, lazy=True)``) or through
:func:`dressage.schemas.validate.validate_table`, which turns failures into one JSON report that
names every failing check, column, row and id.
"""

from __future__ import annotations

from typing import Any

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from dressage.trajectory import FinishReason

FINISH_REASONS = [r.value for r in FinishReason]
SAMPLE_STATUSES = ["pending", "completed", "truncated", "aborted", "failed"]

# -- row-rule expressions (shared by the models and by the vocabulary check) ------------------


def lengths_equal(first: str, *others: str) -> pl.Expr:
    """``len(first) == len(other)`` for every other list column (null lists are skipped)."""
    n = pl.col(first).list.len()
    ok = pl.lit(True)
    for other in others:
        ok = ok & (pl.col(other).is_null() | (pl.col(other).list.len() == n))
    return ok


def list_len_is(column: str, length_column: str) -> pl.Expr:
    return pl.col(column).is_null() | (pl.col(column).list.len() == pl.col(length_column))


def binary(column: str) -> pl.Expr:
    """Every element is 0 or 1 (an empty or null list passes)."""
    c = pl.col(column)
    return c.is_null() | ((c.list.min() >= 0) & (c.list.max() <= 1)).fill_null(True)


def finite_nonpositive(column: str) -> pl.Expr:
    """Every element is a finite log-probability (<= 0, not NaN, not -inf)."""
    c = pl.col(column)
    in_range = ((c.list.max() <= 0) & (c.list.min() > float("-inf"))).fill_null(True)
    no_nan = ~c.list.eval(pl.element().is_nan()).list.any().fill_null(False)
    return c.is_null() | (in_range & no_nan)


def ids_below(column: str, vocab_size: int) -> pl.Expr:
    c = pl.col(column)
    return c.is_null() | ((c.list.min() >= 0) & (c.list.max() < vocab_size)).fill_null(True)


def ids_nonnegative(column: str) -> pl.Expr:
    c = pl.col(column)
    return c.is_null() | (c.list.min() >= 0).fill_null(True)


def _frame(data: PolarsData, expr: pl.Expr) -> pl.LazyFrame:
    return data.lazyframe.select(expr)


_LIST_I32 = pl.List(pl.Int32)
_LIST_I8 = pl.List(pl.Int8)
_LIST_F32 = pl.List(pl.Float32)


def _field(**kwargs: Any) -> Any:
    return pa.Field(**kwargs)


def _response_checks(*, mask: str, length: str) -> tuple[Any, Any, Any, Any]:
    """The row checks a sample and a train_data row share, over their own column names.

    ``length`` (the response length) bounds ``tokens`` and is the length of the ``mask`` list
    and of both log-prob lists; the mask is binary, log-probs finite and <= 0, token ids >= 0.
    The model assigns the four checks in its class body, under these names (pandera reads
    them from the class, and names failures after them).
    """

    @pa.dataframe_check
    def response_lengths_agree(cls: Any, data: PolarsData) -> pl.LazyFrame:
        return _frame(
            data,
            list_len_is(mask, length)
            & list_len_is("rollout_log_probs", length)
            & list_len_is("teacher_log_probs", length)
            & (pl.col(length) <= pl.col("tokens").list.len()),
        )

    @pa.check(mask)
    def mask_is_binary(cls: Any, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, binary(data.key))

    @pa.check("rollout_log_probs", "teacher_log_probs")
    def logprobs_finite_nonpositive(cls: Any, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, finite_nonpositive(data.key))

    @pa.check("tokens")
    def token_ids_nonnegative(cls: Any, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, ids_nonnegative(data.key))

    return (
        response_lengths_agree,
        mask_is_binary,
        logprobs_finite_nonpositive,
        token_ids_nonnegative,
    )


# -- models -------------------------------------------------------------------------------------


class StepModel(pa.DataFrameModel):
    """One proxy call (dressage.trajectory.StepRecord)."""

    session_id: str = _field(str_length={"min_value": 1})
    step_index: pl.Int32 = _field(ge=0)
    segment_index: pl.Int32 = _field(ge=0)
    prefix_length: pl.Int32 = _field(ge=0)
    prompt_delta_ids: _LIST_I32  # type: ignore[valid-type]
    output_ids: _LIST_I32  # type: ignore[valid-type]
    output_logprobs: _LIST_F32  # type: ignore[valid-type]
    output_versions: _LIST_I32  # type: ignore[valid-type]
    finish_reason: str = _field(isin=FINISH_REASONS)
    boundary_reason: str = _field(nullable=True)
    request_id: str
    started_at: pl.Float64
    ended_at: pl.Float64
    messages_json: str
    extra_json: str

    class Config:
        strict = True

    @pa.dataframe_check
    @classmethod
    def output_lengths_agree(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, lengths_equal("output_ids", "output_logprobs", "output_versions"))

    @pa.check("output_logprobs")
    @classmethod
    def logprobs_finite_nonpositive(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, finite_nonpositive(data.key))

    @pa.check("prompt_delta_ids", "output_ids")
    @classmethod
    def token_ids_nonnegative(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, ids_nonnegative(data.key))

    @pa.dataframe_check
    @classmethod
    def step_indices_unique_per_session(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, pl.col("step_index").is_unique().over("session_id"))


class SegmentModel(pa.DataFrameModel):
    """One segment of a session (dressage.trajectory.Segment)."""

    session_id: str = _field(str_length={"min_value": 1})
    segment_index: pl.Int32 = _field(ge=0)
    tokens: _LIST_I32  # type: ignore[valid-type]
    full_loss_mask: _LIST_I8  # type: ignore[valid-type]
    full_logprobs: _LIST_F32  # type: ignore[valid-type]
    full_versions: _LIST_I32 = _field(nullable=True)  # type: ignore[valid-type]
    prompt_length: pl.Int32 = _field(ge=0)
    finish_reason: str = _field(isin=FINISH_REASONS)
    messages_json: str
    extra_info_json: str

    class Config:
        strict = True

    @pa.dataframe_check
    @classmethod
    def token_lengths_agree(cls, data: PolarsData) -> pl.LazyFrame:
        lists = ("full_loss_mask", "full_logprobs", "full_versions")
        return _frame(data, lengths_equal("tokens", *lists))

    @pa.check("full_loss_mask")
    @classmethod
    def mask_is_binary(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, binary(data.key))

    @pa.check("full_logprobs")
    @classmethod
    def logprobs_finite_nonpositive(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, finite_nonpositive(data.key))

    @pa.check("tokens")
    @classmethod
    def token_ids_nonnegative(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, ids_nonnegative(data.key))

    @pa.dataframe_check
    @classmethod
    def prompt_tokens_untrained(cls, data: PolarsData) -> pl.LazyFrame:
        mask = pl.col("full_loss_mask")
        within = pl.col("prompt_length") <= pl.col("tokens").list.len()
        return _frame(data, within & (mask.list.head(pl.col("prompt_length")).list.sum() == 0))

    @pa.dataframe_check
    @classmethod
    def segment_indices_contiguous(cls, data: PolarsData) -> pl.LazyFrame:
        idx, n = pl.col("segment_index"), pl.len().over("session_id")
        contiguous = (
            (idx.min().over("session_id") == 0)
            & (idx.max().over("session_id") == n - 1)
            & (idx.n_unique().over("session_id") == n)
        )
        return _frame(data, contiguous)


class SampleModel(pa.DataFrameModel):
    """One slime ``Sample`` (dressage.types.Sample)."""

    index: pl.Int64 = _field(nullable=True)
    group_index: pl.Int64 = _field(nullable=True)
    rollout_id: pl.Int64 = _field(nullable=True)
    session_id: str = _field(nullable=True)
    prompt_json: str
    tokens: _LIST_I32  # type: ignore[valid-type]
    response: str
    response_length: pl.Int32 = _field(ge=0)
    label: str = _field(nullable=True)
    reward: pl.Float64 = _field(nullable=True)
    reward_json: str = _field(nullable=True)
    loss_mask: _LIST_I8 = _field(nullable=True)  # type: ignore[valid-type]
    rollout_log_probs: _LIST_F32 = _field(nullable=True)  # type: ignore[valid-type]
    teacher_log_probs: _LIST_F32 = _field(nullable=True)  # type: ignore[valid-type]
    weight_versions: pl.List(pl.String)  # type: ignore[valid-type]
    status: str = _field(isin=SAMPLE_STATUSES)
    remove_sample: bool
    metadata_json: str
    train_metadata_json: str = _field(nullable=True)
    generate_function_path: str = _field(nullable=True)
    custom_rm_path: str = _field(nullable=True)
    non_generation_time: pl.Float64

    class Config:
        strict = True

    (
        response_lengths_agree,
        mask_is_binary,
        logprobs_finite_nonpositive,
        token_ids_nonnegative,
    ) = _response_checks(mask="loss_mask", length="response_length")

    @pa.dataframe_check
    @classmethod
    def reward_is_number_or_dict(cls, data: PolarsData) -> pl.LazyFrame:
        # a numeric reward lives in `reward`, a dict reward in `reward_json`; never both
        return _frame(data, ~(pl.col("reward").is_not_null() & pl.col("reward_json").is_not_null()))


class TrainDataModel(pa.DataFrameModel):
    """One row of slime train_data (the dict that convert_samples_to_train_data returns)."""

    tokens: _LIST_I32  # type: ignore[valid-type]
    response_lengths: pl.Int32 = _field(ge=0)
    rewards: pl.Float64
    raw_reward: pl.Float64 = _field(nullable=True)
    truncated: pl.Int8 = _field(isin=[0, 1])
    sample_indices: pl.Int64 = _field(nullable=True)
    rollout_ids: pl.Int64
    loss_masks: _LIST_I8  # type: ignore[valid-type]
    rollout_mask_sums: pl.Float64 = _field(ge=0)
    rollout_log_probs: _LIST_F32 = _field(nullable=True)  # type: ignore[valid-type]
    teacher_log_probs: _LIST_F32 = _field(nullable=True)  # type: ignore[valid-type]
    prompt: str = _field(nullable=True)
    source_names: str = _field(nullable=True)

    class Config:
        strict = True

    (
        response_lengths_agree,
        mask_is_binary,
        logprobs_finite_nonpositive,
        token_ids_nonnegative,
    ) = _response_checks(mask="loss_masks", length="response_lengths")

    @pa.check("rewards")
    @classmethod
    def rewards_finite(cls, data: PolarsData) -> pl.LazyFrame:
        return _frame(data, pl.col(data.key).is_finite())

    @pa.dataframe_check
    @classmethod
    def live_samples_have_denominators(cls, data: PolarsData) -> pl.LazyFrame:
        live = pl.col("loss_masks").list.sum() > 0
        return _frame(data, ~live | (pl.col("rollout_mask_sums") > 0))


class ManifestFilesModel(pa.DataFrameModel):
    """One data file listed in an artifact manifest."""

    table: str = _field(str_length={"min_value": 1})
    path: str = _field(unique=True, str_matches=r"^(?!/)(?!.*(^|/)\.\.(/|$)).+\.parquet$")
    rows: pl.Int64 = _field(ge=0)
    bytes: pl.Int64 = _field(ge=0)
    sha256: str = _field(str_matches=r"^[0-9a-f]{64}$")

    class Config:
        strict = True


MODELS: dict[str, type[pa.DataFrameModel]] = {
    "steps": StepModel,
    "segments": SegmentModel,
    "samples": SampleModel,
    "train_data": TrainDataModel,
    "manifest_files": ManifestFilesModel,
}

# The list column that holds token ids, for the vocabulary check.
TOKEN_COLUMNS: dict[str, tuple[str, ...]] = {
    "steps": ("prompt_delta_ids", "output_ids"),
    "segments": ("tokens",),
    "samples": ("tokens",),
    "train_data": ("tokens",),
    "manifest_files": (),
}
