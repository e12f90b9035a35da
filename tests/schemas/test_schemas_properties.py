"""Property tests: valid tables pass every rule; each kind of corruption is caught by name."""

from __future__ import annotations

import math
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dressage.schemas import (
    samples_to_table,
    segments_to_table,
    train_data_to_table,
    validate_table,
)
from dressage.trajectory import Segment
from dressage.types import Sample

pytestmark = pytest.mark.unit
VOCAB = 1000
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def segment_lists(draw: st.DrawFn) -> list[Segment]:
    out = []
    for s in range(draw(st.integers(1, 3))):
        for k in range(draw(st.integers(1, 3))):
            prompt = draw(st.integers(1, 6))
            n = prompt + draw(st.integers(1, 20))
            tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
            mask = [0] * prompt + draw(
                st.lists(st.integers(0, 1), min_size=n - prompt, max_size=n - prompt)
            )
            logprobs = [-draw(st.floats(0, 30, width=32)) if m else 0.0 for m in mask]
            out.append(
                Segment(
                    session_id=f"sess-{s}",
                    segment_index=k,
                    tokens=tokens,
                    full_loss_mask=mask,
                    full_logprobs=logprobs,
                    messages=[{"role": "user", "content": "q"}],
                    finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls"])),
                    full_versions=[0 if m else -1 for m in mask],
                    prompt_length=prompt,
                )
            )
    return out


def _failed(report: Any) -> set[str]:
    return {f.check for f in report.failures}


def _set_cell(df: pl.DataFrame, column: str, row: int, value: Any) -> pl.DataFrame:
    values = df[column].to_list()
    values[row] = value
    return df.with_columns(pl.Series(column, values, dtype=df.schema[column]))


@SETTINGS
@given(segment_lists())
def test_valid_segments_pass(segments: list[Segment]) -> None:
    report = validate_table("segments", segments_to_table(segments), vocab_size=VOCAB)
    assert report.ok, report.to_json()


# corruption name -> (column, function producing the bad cell from the good one, check expected)
SEGMENT_CORRUPTIONS = {
    "mask_too_short": ("full_loss_mask", lambda c: c[:-1], "token_lengths_agree"),
    "logprobs_too_long": ("full_logprobs", lambda c: [*c, -1.0], "token_lengths_agree"),
    "mask_value_2": ("full_loss_mask", lambda c: [*c[:-1], 2], "mask_is_binary"),
    "nan_logprob": ("full_logprobs", lambda c: [*c[:-1], math.nan], "logprobs_finite_nonpositive"),
    "positive_logprob": ("full_logprobs", lambda c: [*c[:-1], 0.5], "logprobs_finite_nonpositive"),
    "neg_inf_logprob": (
        "full_logprobs",
        lambda c: [*c[:-1], -math.inf],
        "logprobs_finite_nonpositive",
    ),
    "token_beyond_vocab": (
        "tokens",
        lambda c: [*c[:-1], VOCAB + 5],
        "token_ids_below_vocab_size(1000)",
    ),
    "negative_token": ("tokens", lambda c: [*c[:-1], -3], "token_ids_nonnegative"),
    "bad_finish_reason": ("finish_reason", lambda c: "eos", "isin"),
    "trained_prompt_token": ("full_loss_mask", lambda c: [1, *c[1:]], "prompt_tokens_untrained"),
    "segment_gap": ("segment_index", lambda c: c + 7, "segment_indices_contiguous"),
}


@SETTINGS
@given(segment_lists(), st.sampled_from(sorted(SEGMENT_CORRUPTIONS)), st.data())
def test_each_segment_corruption_is_caught_and_named(
    segments: list[Segment], corruption: str, data: st.DataObject
) -> None:
    column, corrupt, check = SEGMENT_CORRUPTIONS[corruption]
    df = pl.from_arrow(segments_to_table(segments))
    assert isinstance(df, pl.DataFrame)
    row = data.draw(st.integers(0, df.height - 1))
    bad = _set_cell(
        df,
        column,
        row,
        corrupt(df[column][row] if df.schema[column] != pl.Int32 else int(df[column][row])),
    )
    report = validate_table("segments", bad, vocab_size=VOCAB)
    names = _failed(report)
    assert any(n.startswith(check) for n in names), (corruption, report.to_json())
    failure = next(f for f in report.failures if f.check.startswith(check))
    assert row in failure.rows
    session, index = df["session_id"][row], df["segment_index"][row]
    if check != "segment_indices_contiguous":
        assert f"session_id={session}/segment_index={index}" in failure.ids


def test_missing_and_mistyped_columns_are_schema_failures(memory_fs: None) -> None:
    seg = Segment("s", 0, [1, 2], [0, 1], [0.0, -1.0], [], "stop", prompt_length=1)
    df = pl.from_arrow(segments_to_table([seg]))
    assert isinstance(df, pl.DataFrame)
    report = validate_table("segments", df.drop("full_logprobs"))
    assert not report.ok and any("full_logprobs" in f.message for f in report.failures)
    report = validate_table("segments", df.with_columns(pl.col("segment_index").cast(pl.Utf8)))
    assert not report.ok and any(f.column == "segment_index" for f in report.failures)


@st.composite
def sample_lists(draw: st.DrawFn) -> list[Sample]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        prompt = draw(st.integers(1, 5))
        n = draw(st.integers(1, 12))
        mask = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
        out.append(
            Sample(
                index=i,
                group_index=i // 2,
                rollout_id=i // 2,
                tokens=list(range(prompt + n)),
                response_length=n,
                loss_mask=mask,
                rollout_log_probs=[-0.25 if m else 0.0 for m in mask],
                reward=draw(st.one_of(st.none(), st.floats(-1, 1), st.just({"acc": 1.0}))),
                status=Sample.Status.COMPLETED,
                metadata={"segment_index": 0},
            )
        )
    return out


@SETTINGS
@given(sample_lists())
def test_valid_samples_pass_and_misaligned_ones_fail(samples: list[Sample]) -> None:
    table = samples_to_table(samples)
    assert validate_table("samples", table).ok
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    bad = _set_cell(df, "response_length", 0, int(df["response_length"][0]) + 1)
    report = validate_table("samples", bad)
    failure = next(f for f in report.failures if f.check == "response_lengths_agree")
    assert failure.rows == [0] and failure.ids == ["index=0/session_id=None"]


def _train_data(n: int) -> dict[str, list[Any]]:
    return {
        "tokens": [[1, 2, 3, 4]] * n,
        "response_lengths": [2] * n,
        "rewards": [0.5] * n,
        "raw_reward": [1.0] * n,
        "truncated": [0] * n,
        "sample_indices": list(range(n)),
        "rollout_ids": [i // 2 for i in range(n)],
        "loss_masks": [[1, 1]] * n,
        "rollout_mask_sums": [4.0] * n,
        "rollout_log_probs": [[-0.1, -0.2]] * n,
        "source_names": ["unknown"] * n,
    }


@pytest.mark.parametrize(
    ("key", "row_value", "check"),
    [
        ("rollout_mask_sums", 0.0, "live_samples_have_denominators"),
        ("loss_masks", [1], "response_lengths_agree"),
        ("rollout_log_probs", [-0.1, float("nan")], "logprobs_finite_nonpositive"),
        ("rewards", float("inf"), "rewards_finite"),
        ("truncated", 3, "isin"),
    ],
)
def test_train_data_corruptions(key: str, row_value: Any, check: str) -> None:
    data = _train_data(4)
    assert validate_table("train_data", train_data_to_table(data)).ok
    data[key] = list(data[key])
    data[key][2] = row_value
    report = validate_table("train_data", train_data_to_table(data))
    failure = next(f for f in report.failures if f.check.startswith(check))
    assert failure.rows == [2] and failure.ids == ["sample_indices=2/rollout_ids=1"]


def test_removed_samples_may_have_zero_denominator() -> None:
    data = _train_data(2)
    data["loss_masks"] = [[0, 0], [1, 1]]
    data["rollout_mask_sums"] = [0.0, 2.0]
    assert validate_table("train_data", train_data_to_table(data)).ok


SHARED_CORRUPTIONS = [
    ("mask", [1, 2], "mask_is_binary"),
    ("mask", [1], "response_lengths_agree"),
    ("rollout_log_probs", [-0.1, float("nan")], "logprobs_finite_nonpositive"),
    ("tokens", [1, -2, 3, 4], "token_ids_nonnegative"),
]


@pytest.mark.parametrize(("column", "row_value", "check"), SHARED_CORRUPTIONS)
def test_samples_and_train_data_share_their_response_checks(
    column: str, row_value: Any, check: str
) -> None:
    """One definition of the response checks, over each table's own column names."""
    sample = Sample(index=0, tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1], reward=1.0)
    sample.rollout_log_probs = [-0.1, -0.2]
    tables = {
        "samples": (pl.from_arrow(samples_to_table([sample] * 3)), "loss_mask"),
        "train_data": (pl.from_arrow(train_data_to_table(_train_data(3))), "loss_masks"),
    }
    failed = {}
    for kind, (df, mask) in tables.items():
        assert isinstance(df, pl.DataFrame) and validate_table(kind, df).ok
        bad = _set_cell(df, mask if column == "mask" else column, 1, row_value)
        failed[kind] = {
            (f.check, f.column, tuple(f.rows)) for f in validate_table(kind, bad).failures
        }
    expected_column = None if check == "response_lengths_agree" else column
    for kind, (_, mask) in tables.items():
        named = mask if expected_column == "mask" else expected_column
        assert failed[kind] == {(check, named, (1,))}, kind
