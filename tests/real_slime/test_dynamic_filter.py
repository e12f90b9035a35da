"""slime's own DAPO filter (``--dynamic-sampling-filter-path
slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std``) through the
partial-async rollout: zero-spread groups never reach training, the batch stays full."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dressage.rollout import partial_async_rollout as par
from dressage.types import RolloutFnTrainOutput
from tests.rollout import partial_async_hooks as hooks

HOOKS = "tests.rollout.partial_async_hooks"
SLIME_FILTER = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    hooks.VERSION["current"] = 0
    yield
    par.stop_partial_async_workers()


def test_slimes_filter_drops_zero_spread_groups_from_the_partial_async_rollout() -> None:
    args = hooks.rollout_args(
        dressage_async_max_groups_ahead=4,
        custom_rm_path=f"{HOOKS}.reward_odd_groups_vary",
        dynamic_sampling_filter_path=SLIME_FILTER,
    )
    source = hooks.ListDataSource()
    for rid in range(2):
        out = par.generate_rollout_partial_async(args, rid, source)
        assert isinstance(out, RolloutFnTrainOutput) and len(out.samples) == 2
        assert all(group[0].group_index % 2 == 1 for group in out.samples)
        assert out.metrics is not None and out.metrics["partial_async/filtered_groups"] >= 1
