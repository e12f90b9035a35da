"""expand_segments_to_samples, mark_aborted_no_grad and the multi-segment metrics."""

from __future__ import annotations

import pytest

from dressage.rollout.multi_segment import (
    expand_segments_to_samples,
    mark_aborted_no_grad,
    multi_segment_metrics,
)
from dressage.schemas import samples_to_table, validate_table
from dressage.slime.sample_meta import cached_loss_mask_sum
from dressage.types import Sample
from tests.rollout.factories import segment, slime_args, template

pytestmark = pytest.mark.unit


def _segments(n: int, session: str = "sess-7") -> list:
    return [segment(session, k, seed=k) for k in range(n)]


def test_one_sample_per_segment_in_order_with_shared_ids() -> None:
    tmpl = template(index=5, group_index=2)
    segs = _segments(3)
    samples = expand_segments_to_samples(
        tmpl, list(reversed(segs)), args=slime_args(), agent_response="Answer: 4"
    )
    assert [s.metadata["segment_index"] for s in samples] == [0, 1, 2]
    assert [s.tokens for s in samples] == [seg.tokens for seg in segs]
    assert {s.rollout_id for s in samples} == {5}  # template has no rollout_id: its index
    assert {s.group_index for s in samples} == {2}
    for s in samples:
        assert s.metadata["parent_traj_id"] == "sess-7" == s.session_id
        assert s.metadata["instance_id"] == "prompt-2"
        assert s.metadata["num_segments"] == 3
    assert [s.reward for s in samples] == [0.0, 0.0, None]
    assert [s.response for s in samples] == ["", "", "Answer: 4"]
    assert validate_table("samples", samples_to_table(samples)).ok


def test_template_rollout_id_wins_and_copies_are_independent() -> None:
    tmpl = template(index=5, group_index=2)
    tmpl.rollout_id = 99
    samples = expand_segments_to_samples(tmpl, _segments(2), args=slime_args())
    assert {s.rollout_id for s in samples} == {99}
    samples[0].metadata["x"] = 1
    assert "x" not in samples[1].metadata and "x" not in tmpl.metadata
    assert "parent_traj_id" not in tmpl.metadata and tmpl.tokens == []


def test_explicit_ids_override_template() -> None:
    tmpl = template(index=1, group_index=3)
    samples = expand_segments_to_samples(
        tmpl, _segments(1), args=slime_args(), session_id="sess-7", instance_id="row-9"
    )
    assert samples[0].metadata["instance_id"] == "row-9"
    assert samples[0].reward is None


@pytest.mark.parametrize(
    ("indices", "message"),
    [([0, 0, 1], "duplicate"), ([0, 2], "missing \\[1\\]"), ([1, 2], "missing \\[0\\]"), ([], "")],
)
def test_duplicate_or_missing_segment_indices_are_rejected(indices: list, message: str) -> None:
    segs = [segment("sess-7", k, seed=j) for j, k in enumerate(indices)]
    with pytest.raises(ValueError, match=f"sample index=4.*segment.*{message}"):
        expand_segments_to_samples(template(4, 0), segs, args=slime_args())


def test_mixed_sessions_and_wrong_session_are_rejected() -> None:
    segs = [segment("a", 0), segment("b", 1)]
    with pytest.raises(ValueError, match="field=session_id.*sessions"):
        expand_segments_to_samples(template(0, 0), segs, args=slime_args())
    with pytest.raises(ValueError, match="field=session_id: expected 'other'"):
        expand_segments_to_samples(
            template(0, 0), [segment("a", 0)], args=slime_args(), session_id="other"
        )


def test_missing_rollout_and_prompt_ids_are_rejected() -> None:
    bare = Sample(prompt="q", group_index=8)
    with pytest.raises(ValueError, match="sample index=None.*field=rollout_id"):
        expand_segments_to_samples(bare, _segments(1), args=slime_args())
    bare.index, bare.group_index = 3, None
    with pytest.raises(ValueError, match="sample index=3.*field=metadata.instance_id"):
        expand_segments_to_samples(bare, _segments(1), args=slime_args())
    bare.group_index = 8  # the prompt falls back to group_index
    assert (
        expand_segments_to_samples(bare, _segments(1), args=slime_args())[0].metadata["instance_id"]
        == "8"
    )


def test_mark_aborted_no_grad_keeps_the_trajectory_countable() -> None:
    tmpl = template(index=6, group_index=1)
    failed = mark_aborted_no_grad(tmpl, reason="agent timed out after 3 tries")
    assert failed is tmpl
    assert failed.rollout_id == 6 and failed.group_index == 1
    assert failed.metadata["instance_id"] == "prompt-1"
    assert failed.metadata["no_grad_reason"] == "agent timed out after 3 tries"
    assert failed.remove_sample and failed.reward == 0.0
    assert failed.status == Sample.Status.FAILED
    assert len(failed.tokens) == 2 and failed.response_length == 1
    assert failed.loss_mask == [0] and failed.rollout_log_probs == [0.0]
    assert cached_loss_mask_sum(failed) == 0
    assert validate_table("samples", samples_to_table([failed])).ok


def test_mark_aborted_no_grad_on_a_partial_sample_zeroes_its_mask() -> None:
    [sample] = expand_segments_to_samples(template(2, 0), _segments(1), args=slime_args())
    n = sample.response_length
    mark_aborted_no_grad(sample, reason="crash", status=Sample.Status.ABORTED)
    assert sample.response_length == n and sample.loss_mask == [0] * n
    assert sample.status == Sample.Status.ABORTED
    assert sample.metadata["num_segments"] == 1 and sample.metadata["segment_index"] == 0


def test_metrics_count_trajectories_not_samples() -> None:
    args = slime_args()
    three = expand_segments_to_samples(template(0, 0), _segments(3, "a"), args=args)
    one = expand_segments_to_samples(template(1, 0), _segments(1, "b"), args=args)
    failed = mark_aborted_no_grad(template(2, 0), reason="x")
    metrics = multi_segment_metrics([*three, *one, failed])
    assert metrics["multi_segment/samples"] == 5
    assert metrics["multi_segment/trajectories"] == 3
    assert metrics["multi_segment/segments_per_trajectory_max"] == 3
    assert metrics["multi_segment/multi_segment_fraction"] == pytest.approx(1 / 3)
    assert metrics["multi_segment/no_grad_fraction"] == pytest.approx(1 / 3)
    assert multi_segment_metrics([]) == {}
