"""The partial-async rollout function: full batches, carry-over, start-version tags, the
staleness bound (drop and mask), evaluation without carry-over, and failures that surface."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from dressage.rollout import partial_async_rollout as par
from dressage.rollout.group_generation import leaves
from dressage.types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample
from tests.rollout import partial_async_hooks as hooks

pytestmark = pytest.mark.unit

HOOKS = "tests.rollout.partial_async_hooks"


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    hooks.VERSION["current"] = 0
    hooks.FAIL_INDEX["index"] = -1
    yield
    par.stop_partial_async_workers()


def _args(**overrides: Any) -> SimpleNamespace:
    return hooks.rollout_args(**overrides)


def _rollout(args: Any, rid: int, source: Any) -> RolloutFnTrainOutput:
    out = par.generate_rollout_partial_async(args, rid, source)
    assert isinstance(out, RolloutFnTrainOutput)
    return out


def test_slimes_call_shape() -> None:
    signature = inspect.signature(par.generate_rollout_partial_async)
    assert list(signature.parameters) == ["args", "rollout_id", "data_source", "evaluation"]
    assert signature.parameters["evaluation"].default is False


def test_each_call_returns_a_full_batch_and_carries_the_rest_over() -> None:
    source, args = hooks.ListDataSource(), _args()
    returned: list[int] = []
    for rid in range(3):
        out = _rollout(args, rid, source)
        assert len(out.samples) == 2 and all(len(g) == 2 for g in out.samples)
        for group in out.samples:
            assert len({s.group_index for s in group}) == 1
            assert all(s.reward == pytest.approx(1 + s.index / 1000) for s in group)
            assert all(s.metadata["dressage_group_start_version"] == 0 for s in group)
        returned += [g[0].group_index for g in out.samples]
        assert out.metrics is not None and out.metrics["partial_async/groups_started"] >= 6
    assert len(set(returned)) == 6, "no group is returned twice"
    worker = par._WORKERS[id(source)]
    deadline = time.monotonic() + 10
    while worker.finished.qsize() < 6 and time.monotonic() < deadline:
        time.sleep(0.02)  # the worker keeps generating between calls
    carried = [g.samples[0].group_index for g in list(worker.finished.queue)]
    assert len(carried) >= 6 and not set(carried) & set(returned)
    out = _rollout(args, 3, source)
    assert [g[0].group_index for g in out.samples] == carried[:2], "oldest finished first"


def test_held_groups_are_every_prompt_taken_and_not_yet_returned_as_fresh_copies() -> None:
    source, args = hooks.ListDataSource(), _args(dressage_async_max_groups_ahead=6)
    with par.held_groups(source) as held:
        assert held == []  # no worker yet
    returned = [g[0].group_index for rid in range(2) for g in _rollout(args, rid, source).samples]
    time.sleep(0.1)  # some groups generating, some finished
    with par.held_groups(source) as held:
        taken = source.group_index  # the worker takes nothing while the block runs
        time.sleep(0.1)
        assert source.group_index == taken
    indices = [g[0].group_index for g in held]
    assert held and indices == sorted(indices)
    assert sorted(returned + indices) == list(range(taken)), "each prompt once: returned or held"
    for group in held:  # the prompts as the data source gave them, not the generated samples
        assert all(s.status == Sample.Status.PENDING and not s.tokens for s in group)
        assert all("dressage_group_start_version" not in s.metadata for s in group)


def test_the_worker_keeps_at_most_the_bound_ahead_of_training() -> None:
    source, args = hooks.ListDataSource(), _args(dressage_async_max_groups_ahead=6)
    _rollout(args, 0, source)
    worker = par._WORKERS[id(source)]
    deadline = time.monotonic() + 10
    while worker.finished.qsize() < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # time enough for the fake agents to finish several more groups
    assert worker.finished.qsize() == 6
    assert worker.started == 2 + 6, "the 2 groups taken and the 6 ahead, nothing more"
    _rollout(args, 1, source)  # taking 2 frees room for 2 more
    deadline = time.monotonic() + 10
    while worker.started < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    assert worker.started == 10


def test_stale_groups_are_dropped_and_their_prompts_requeued() -> None:
    source = hooks.ListDataSource()
    args = _args(dressage_max_staleness=1, dressage_stale_policy="drop")
    _rollout(args, 0, source)
    worker = par._WORKERS[id(source)]
    while worker.finished.qsize() < 4:
        time.sleep(0.02)
    hooks.VERSION["current"] = 3  # two weight updates later: the carried groups are too old
    out = _rollout(args, 1, source)
    assert out.metrics is not None and out.metrics["partial_async/dropped_stale_groups"] >= 4
    for sample in leaves(out.samples):
        assert par.oldest_version([sample]) is not None
        assert par.oldest_version([sample]) >= 2  # type: ignore[operator]
    assert len(source.requeued) >= 4
    for group in source.requeued:  # fresh prompt copies, not the finished samples
        assert all(s.status == Sample.Status.PENDING and not s.tokens for s in group)


def test_stale_tokens_are_masked_when_configured() -> None:
    source = hooks.ListDataSource()
    args = _args(dressage_max_staleness=0, dressage_stale_policy="mask")
    _rollout(args, 0, source)
    hooks.VERSION["current"] = 1
    time.sleep(0.02)
    masked = kept_old = 0
    for rid in range(1, 4):
        out = _rollout(args, rid, source)
        for sample in leaves(out.samples):
            versions = sample.metadata["full_versions"][2:]
            for m, v in zip(sample.loss_mask, versions, strict=True):
                assert m == (1 if v >= 1 else 0), (versions, sample.loss_mask)
                masked += v < 1
            kept_old += 0 in versions
    assert masked > 0 and kept_old > 0, "old tokens were kept, with mask 0"


def test_evaluation_runs_one_plain_batch() -> None:
    source, args = hooks.ListDataSource(), _args()
    out = par.generate_rollout_partial_async(args, 5, source, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput)
    data = out.data["default"]
    assert len(data["samples"]) == 4 and len(data["rewards"]) == 4
    assert id(source) not in par._WORKERS, "evaluation starts no background worker"


def test_a_failing_agent_surfaces_in_the_next_call() -> None:
    source, args = hooks.ListDataSource(), _args()
    hooks.FAIL_INDEX["index"] = 3
    with pytest.raises(RuntimeError, match="agent of sample 3 crashed"):
        for rid in range(5):
            _rollout(args, rid, source)


def test_a_dynamic_sampling_filter_keeps_only_groups_whose_rewards_differ() -> None:
    source = hooks.ListDataSource()
    args = _args(
        custom_rm_path=f"{HOOKS}.reward_odd_groups_vary",
        dynamic_sampling_filter_path="dressage.rollout.filters.nonzero_reward_std",
        dressage_async_max_groups_ahead=4,
    )
    for rid in range(3):
        out = _rollout(args, rid, source)
        assert len(out.samples) == 2
        for group in out.samples:
            assert group[0].group_index % 2 == 1, "a zero-spread group reached training"
            assert sorted(s.reward for s in group) == [0.0, 1.0]
        assert out.metrics is not None
        assert out.metrics["partial_async/filtered_groups"] >= 1
        assert (
            out.metrics["partial_async/filtered/zero_std_0.0"]
            == (out.metrics["partial_async/filtered_groups"])
        )


def test_a_filter_that_rejects_everything_fails_the_call_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(par, "MAX_FILTERED_IN_A_ROW", 2)
    args = _args(dynamic_sampling_filter_path=f"{HOOKS}.reject_every_group")
    with pytest.raises(RuntimeError, match=r"reject_every_group rejected 4 groups in a row"):
        _rollout(args, 0, hooks.ListDataSource())


def test_a_fallback_filter_keeps_a_rejected_group_only_when_the_batch_would_run_short() -> None:
    import queue

    args = _args(
        dynamic_sampling_filter_path="dressage.rollout.filters.nonzero_reward_std_with_fallback"
    )
    keep = par._dynamic_filter(args)
    flat = [Sample(prompt="p", reward=0.0), Sample(prompt="p", reward=0.0)]
    group = par.FinishedGroup(flat, [], 0, 0.0, 0.0)
    worker = SimpleNamespace(batch=4, in_flight=0, finished=queue.Queue())
    metrics: dict[str, float] = {}
    assert keep(worker, group, 3, metrics)  # nothing else is coming: kept
    worker.in_flight = 1
    assert not keep(worker, group, 3, metrics)  # one more is generating: dropped
    assert metrics == {"filtered_groups": 1.0, "filtered/zero_std_0.0": 1.0}
