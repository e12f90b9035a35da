"""Contract: the converter emits slime's train_data keys (tests/contracts/slime.json).

The key lists are the contract data's, which the real-slime tier checks against slime's
default converter and DP split; the hook call shapes are checked in
tests/training/test_mopd_slime_contract.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from dressage.rollout.convert_samples import convert_samples_to_train_data
from tests.rollout.factories import batch, slime_args
from tests.training.slime_contract import contract

pytestmark = pytest.mark.unit


def _full_batch(args: Any) -> list:
    samples = batch(args, [[[1, 2], [3]]], teacher_id="t")
    for s in samples:
        n = s.response_length
        s.metadata["round_number"] = 1
        s.train_metadata = {"k": 1}
        s.rollout_routed_experts = [[0]]
        s.teacher_log_probs = [-0.1] * n
        s.rollout_top_p_token_ids = [1] * n
        s.rollout_top_p_token_offsets = list(range(n + 1))
        s.multimodal_train_inputs = {"pixel_values": [0]}
    return samples


def test_converter_emits_every_key_of_slimes_default() -> None:
    expected = contract()["default_train_data_keys"]
    args = slime_args(rollout_top_p=0.9)
    data = convert_samples_to_train_data(args, _full_batch(args))
    assert set(data) == set(expected)
    mopd = slime_args(rollout_top_p=0.9, advantage_estimator="mopd", rewards_normalization=False)
    assert set(convert_samples_to_train_data(mopd, _full_batch(mopd))) == set(expected) | {"prompt"}
    base = ["tokens", "response_lengths", "rewards", "raw_reward", "truncated", "sample_indices"]
    assert list(data)[: len(base) + 3] == [*base, "rollout_ids", "loss_masks", "rollout_mask_sums"]
    assert all(len(v) == 3 for v in data.values())


def test_everything_the_trainer_needs_is_forwarded_per_dp_rank() -> None:
    forwarded = set(contract()["dp_forwarded_keys"])
    assert "prompt" in forwarded and "rollout_ids" in forwarded
    args = slime_args(rollout_top_p=0.9, advantage_estimator="mopd", rewards_normalization=False)
    data = convert_samples_to_train_data(args, _full_batch(args))
    # raw_reward is shipped whole; metadata is dropped by slime (docs/slime.md §3.3)
    assert set(data) - forwarded == {"metadata"} | set(contract()["dp_whole_keys"]) - {
        "total_lengths"  # added by slime's split itself
    }
