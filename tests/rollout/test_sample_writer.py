"""write_sample_from_segment: split, alignment, caps, status and version metadata."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.rollout.artifacts.samples import write_sample_from_segment
from dressage.schemas import samples_to_table, validate_table
from dressage.slime.sample_meta import cached_loss_mask_sum
from dressage.types import Sample
from tests.rollout.factories import segment, slime_args

pytestmark = pytest.mark.unit

runs_strategy = st.lists(st.tuples(st.integers(0, 1), st.integers(1, 6)), min_size=0, max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.integers(0, 8),
    runs=runs_strategy,
    max_tokens=st.one_of(st.none(), st.integers(1, 30)),
    cp=st.integers(1, 3),
    cp_field=st.sampled_from(["context_parallel_size", "cp_size"]),
)
def test_alignment_and_caps(
    prompt: int, runs: list[tuple[int, int]], max_tokens: int | None, cp: int, cp_field: str
) -> None:
    seg = segment(prompt=prompt, runs=runs)
    if not seg.tokens:
        return  # an empty segment is rejected (tested below)
    cp_args = {"context_parallel_size": None, cp_field: cp}  # slime or its cp_size spelling
    args = slime_args(max_tokens_per_gpu=max_tokens, **cp_args)
    sample = write_sample_from_segment(Sample(index=1), seg, args=args)
    n = len(seg.tokens)
    cap = n if max_tokens is None else max_tokens * cp
    end = min(n, cap)
    r = sample.response_length
    assert sample.tokens == seg.tokens[:end]
    assert 1 <= r <= end
    assert len(sample.loss_mask or []) == len(sample.rollout_log_probs or []) == r
    assert sample.loss_mask == seg.full_loss_mask[end - r : end]
    assert sample.rollout_log_probs == seg.full_logprobs[end - r : end]
    assert end - r == min(prompt, end - 1)  # the prompt, or all but one position of it
    assert sample.metadata["truncated"] == (n > cap)
    assert cached_loss_mask_sum(sample) == sum(sample.loss_mask or [])
    assert len(sample.metadata["full_versions"]) == end
    assert validate_table("samples", samples_to_table([sample])).ok


def test_finish_length_is_truncated_and_other_reasons_complete() -> None:
    args = slime_args()
    truncated = write_sample_from_segment(Sample(), segment(finish="length"), args=args)
    assert truncated.status == Sample.Status.TRUNCATED
    for finish in ("stop", "tool_calls", "segment_boundary", "abort"):
        done = write_sample_from_segment(Sample(), segment(finish=finish), args=args)
        assert done.status == Sample.Status.COMPLETED, finish
    capped = write_sample_from_segment(Sample(), segment(), args=slime_args(max_tokens_per_gpu=5))
    assert capped.status == Sample.Status.COMPLETED and capped.metadata["truncated"] is True


def test_version_metadata_of_a_partial_rollout() -> None:
    seg = segment(prompt=2, runs=((1, 3), (0, 2), (1, 2), (1, 1)), versions=[4, 4, 5])
    sample = write_sample_from_segment(Sample(), seg, args=slime_args())
    meta = sample.metadata
    assert meta["dressage_partial_rollout"] is True
    # two trainable runs of version 4 around a tool run, then 5: spans in response positions
    assert meta["version_spans"] == [[4, 0, 3], [4, 5, 7], [5, 7, 8]]
    assert meta["dressage_start_token_version"] == 4
    assert meta["dressage_end_token_version"] == 5
    assert meta["full_versions"] == seg.full_versions
    assert sample.weight_versions == ["4", "5"]
    assert sample.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1]  # not masked unless asked


def test_one_version_is_not_partial() -> None:
    sample = write_sample_from_segment(Sample(), segment(versions=[3, 3]), args=slime_args())
    assert sample.metadata["dressage_partial_rollout"] is False
    assert sample.weight_versions == ["3"]


@pytest.mark.parametrize("how", ["args", "keyword"])
def test_stale_versions_are_masked_when_asked(how: str) -> None:
    seg = segment(prompt=2, runs=((1, 3), (0, 2), (1, 2)), versions=[4, 5])
    if how == "args":
        args, kwargs = slime_args(mask_offpolicy_in_partial_rollout=True), {}
    else:
        args, kwargs = slime_args(), {"mask_stale_versions": True}
    sample = write_sample_from_segment(Sample(), seg, args=args, **kwargs)
    assert sample.loss_mask == [0, 0, 0, 0, 0, 1, 1]
    assert sample.metadata["dressage_masked_stale_tokens"] == 3
    assert cached_loss_mask_sum(sample) == 2
    assert seg.full_loss_mask[2:] == [1, 1, 1, 0, 0, 1, 1]  # the segment is untouched


def test_segment_without_versions_uses_extra_info() -> None:
    seg = segment()
    seg.full_versions = None
    seg.extra_info["weight_versions"] = [7]
    sample = write_sample_from_segment(Sample(), seg, args=slime_args())
    assert sample.weight_versions == ["7"]
    assert sample.metadata["dressage_partial_rollout"] is False
    assert "version_spans" not in sample.metadata


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.5])
def test_bad_logprobs_name_the_sample_and_field(bad: float) -> None:
    seg = segment(session="s-9", index=1)
    seg.full_logprobs[4] = bad
    with pytest.raises(ValueError, match=r"sample index=3 .*s-9#1 field=rollout_log_probs\[1\]"):
        write_sample_from_segment(Sample(index=3), seg, args=slime_args())


def test_mismatched_lengths_and_empty_segments_are_rejected() -> None:
    seg = segment(session="s-2")
    seg.full_loss_mask.append(0)
    with pytest.raises(ValueError, match="s-2#0 field=full_loss_mask: 13 entries but tokens"):
        write_sample_from_segment(Sample(), seg, args=slime_args())
    empty = segment(prompt=0, runs=())
    with pytest.raises(ValueError, match="field=tokens: the segment has no tokens"):
        write_sample_from_segment(Sample(), empty, args=slime_args())
