"""StepRecord and Segment: the recorded shapes, their invariants and their round trips."""

from __future__ import annotations

import math

import pytest

from dressage.schemas import (
    segments_from_table,
    segments_to_table,
    steps_from_table,
    steps_to_table,
)
from dressage.trajectory import NO_VERSION, FinishReason, Segment, StepRecord

pytestmark = pytest.mark.unit


def _step(i: int, prefix: int, delta: list[int], out: list[int], seg: int = 0) -> StepRecord:
    return StepRecord(
        session_id="sess-1",
        step_index=i,
        segment_index=seg,
        prefix_length=prefix,
        prompt_delta_ids=delta,
        output_ids=out,
        output_logprobs=[-0.5] * len(out),
        output_versions=[i] * len(out),
        finish_reason="tool_calls" if i == 0 else "stop",
        messages=[{"role": "user", "content": f"turn {i}"}],
        started_at=100.0 + i,
        ended_at=100.5 + i,
        extra={"sampling": {"temperature": 1.0}},
    )


def test_segment_from_steps_lays_out_masks_logprobs_and_versions() -> None:
    steps = [_step(0, 0, [1, 2, 3], [4, 5]), _step(1, 5, [6], [7, 8, 9])]
    seg = Segment.from_steps(steps, messages=[], finish_reason="stop")
    assert seg.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert seg.full_loss_mask == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert seg.full_logprobs == [0.0, 0.0, 0.0, -0.5, -0.5, 0.0, -0.5, -0.5, -0.5]
    assert seg.full_versions == [NO_VERSION] * 3 + [0, 0, NO_VERSION, 1, 1, 1]
    assert seg.prompt_length == 3 and seg.response_length == 6 and seg.loss_mask_sum == 5
    assert seg.extra_info["weight_versions"] == [0, 1]


def test_from_steps_rejects_a_gap_in_the_prefix() -> None:
    steps = [_step(0, 0, [1, 2], [3]), _step(1, 7, [4], [5])]
    with pytest.raises(ValueError, match="prefix_length 7"):
        Segment.from_steps(steps, messages=[], finish_reason="stop")


def test_from_steps_rejects_steps_of_another_segment() -> None:
    steps = [_step(0, 0, [1], [2]), _step(1, 2, [3], [4], seg=1)]
    with pytest.raises(ValueError, match="belongs to segment 1"):
        Segment.from_steps(steps, messages=[], finish_reason="stop")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"full_loss_mask": [0, 1]}, "tokens has 3 entries"),
        ({"full_loss_mask": [0, 2, 1]}, "other than 0 and 1"),
        ({"full_loss_mask": [0, [1], 1]}, "other than 0 and 1"),
        ({"full_loss_mask": [0, 1, -1]}, "other than 0 and 1"),
        ({"finish_reason": "done"}, "finish_reason 'done'"),
        ({"prompt_length": 2}, "prompt tokens must have loss mask 0"),
        ({"prompt_length": 9}, "outside"),
    ],
)
def test_segment_rejects_bad_shapes(change: dict, message: str) -> None:
    fields = dict(
        session_id="s",
        segment_index=0,
        tokens=[1, 2, 3],
        full_loss_mask=[0, 1, 1],
        full_logprobs=[0.0, -1.0, -1.0],
        messages=[],
        finish_reason="stop",
        prompt_length=1,
    )
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        Segment(**fields)  # type: ignore[arg-type]


def test_a_mask_of_true_and_1_0_is_a_mask_of_ones() -> None:
    seg = Segment("s", 0, [1, 2, 3], [0, True, 1.0], [0.0, -1.0, -1.0], [], "stop", prompt_length=1)
    assert seg.loss_mask_sum == 2


def test_step_rejects_misaligned_outputs_and_bad_logprobs() -> None:
    with pytest.raises(ValueError, match="same length"):
        StepRecord("s", 0, 0, 0, [1], [2, 3], [-1.0], [0, 0], "stop", [], 0.0, 0.0)
    with pytest.raises(ValueError, match=r"output_logprobs\[0\]"):
        StepRecord("s", 0, 0, 0, [1], [2], [math.nan], [0], "stop", [], 0.0, 0.0)
    for i, bad in enumerate([math.nan, -math.inf, math.inf, 0.25, 1e-300]):
        logprobs = [-1.0, -2.0, -3.0]
        logprobs[i % 3] = bad
        with pytest.raises(ValueError, match=rf"output_logprobs\[{i % 3}\]={bad!r} is not"):
            StepRecord("s", 0, 0, 0, [1], [2, 3, 4], logprobs, [0] * 3, "stop", [], 0.0, 0.0)
    # finite and <= 0, though their sum overflows: accepted, as one by one
    big = StepRecord("s", 0, 0, 0, [1], [2, 3], [-1e308, -1e308], [0, 0], "stop", [], 0.0, 0.0)
    assert big.output_logprobs == [-1e308, -1e308]
    with pytest.raises(ValueError, match="finish_reason"):
        StepRecord("s", 0, 0, 0, [1], [2], [-1.0], [0], "eos", [], 0.0, 0.0)


def test_dict_round_trips() -> None:
    steps = [_step(0, 0, [1, 2, 3], [4, 5]), _step(1, 5, [6], [7])]
    seg = Segment.from_steps(
        steps, messages=[{"role": "user", "content": "é 数"}], finish_reason="stop"
    )
    assert Segment.from_dict(seg.to_dict()) == seg
    assert StepRecord.from_dict(steps[0].to_dict()) == steps[0]
    with pytest.raises(ValueError, match="unknown fields"):
        Segment.from_dict({**seg.to_dict(), "bogus": 1})


def test_arrow_round_trips() -> None:
    steps = [_step(0, 0, [1, 2, 3], [4, 5]), _step(1, 5, [6], [7])]
    seg = Segment.from_steps(
        steps, messages=[{"role": "tool", "content": "✓"}], finish_reason="stop"
    )
    seg2 = Segment.from_steps(
        [_step(2, 0, [9], [8], seg=1)],
        messages=[],
        finish_reason=FinishReason.SEGMENT_BOUNDARY.value,
        extra_info={"boundary_reason": "messages_removed"},
        record_versions=False,
    )
    assert segments_from_table(segments_to_table([seg, seg2])) == [seg, seg2]
    assert steps_from_table(steps_to_table(steps)) == steps
