"""build_layout: rollouts, anchors and prompts of segment samples and of plain slime samples."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.slime.layout import MISSING, build_layout, read_columns
from dressage.training.reward_post_process import reward_post_process
from dressage.types import Sample
from tests.rollout.factories import slime_args, template, trajectory

pytestmark = pytest.mark.unit


def plain(index: int, rollout_id: int | None, group: int | None = 0, **metadata: Any) -> Sample:
    """A sample as slime's own producers leave it: segment keys absent or under other names."""
    return Sample(
        index=index,
        group_index=group,
        rollout_id=rollout_id,
        tokens=[1, 2, 3],
        response_length=2,
        loss_mask=[1, 1],
        reward=1.0,
        metadata=dict(metadata),
    )


def test_a_plain_rollout_of_several_samples_is_anchored_at_its_last_sample() -> None:
    samples = [
        plain(0, 4, parent_traj_id="s"),
        plain(1, 5),
        plain(2, 4, parent_traj_id="s", segment_index=1),  # no num_segments: still plain
        plain(3, 4, num_segments=3),  # no segment_index: plain as well
        plain(4, 5, turn=2),  # segment metadata under other names
    ]
    layout = build_layout(samples, need_prompts=True)
    assert layout.rollout_index.tolist() == [0, 1, 0, 0, 1]
    assert layout.anchors.tolist() == [3, 4]


def test_plain_siblings_may_name_other_sessions_but_must_share_prompt_and_teacher() -> None:
    build_layout(
        [plain(0, 1, parent_traj_id="a"), plain(1, 1, parent_traj_id="b")], need_prompts=True
    )
    with pytest.raises(ValueError, match="sample index=0 .*field=group_index: 0 but its anchor"):
        build_layout([plain(0, 1, group=0), plain(1, 1, group=1)], need_prompts=True)
    with pytest.raises(ValueError, match="sample index=0 .*field=metadata.teacher_id"):
        build_layout(
            [plain(0, 1, teacher_id="t-a"), plain(1, 1, teacher_id="t-b")], need_prompts=False
        )


def test_segment_siblings_must_share_their_session() -> None:
    args = slime_args()
    samples = trajectory(args, template(0, 0), [1, 1, 1], reward=1.0)
    samples[0].metadata["parent_traj_id"] = "elsewhere"
    with pytest.raises(ValueError, match="field=metadata.parent_traj_id: 'elsewhere' but"):
        build_layout(samples, need_prompts=True)


def test_a_rollout_mixing_segments_with_plain_samples_names_the_missing_key() -> None:
    args = slime_args()
    samples = trajectory(args, template(0, 0), [1, 1], reward=1.0)
    samples[0].metadata.pop("num_segments")
    with pytest.raises(ValueError, match="sample index=0 .*field=metadata.num_segments: .*mixes"):
        build_layout(samples, need_prompts=True)


def test_plain_siblings_take_their_anchors_reward() -> None:
    args = slime_args(advantage_estimator="ppo", rewards_normalization=False)
    samples = [plain(0, 9), plain(0, 9), plain(1, 3)]
    samples[0].reward = None  # only the anchor's reward is read
    samples[1].reward = 0.5
    raw, rewards = reward_post_process(args, samples)
    assert rewards == [0.5, 0.5, 1.0]
    assert raw == [0.0, 0.5, 1.0]


def test_columns_are_the_samples_fields_in_one_pass() -> None:
    samples = [plain(0, None, source_name="calc", raw_reward=None), plain(1, 2)]
    columns = read_columns(samples)
    assert columns.rollout_ids == [None, 2]
    assert columns.loss_masks[0] is samples[0].loss_mask  # by reference
    assert columns.raw_reward == [None, MISSING]  # a None raw_reward is present, not missing
    assert columns.source_name == ["calc", None]
    with pytest.raises(ValueError, match="no samples"):
        read_columns([])
