"""A synchronous batch rollout: generate and score one batch of prompts, slime's signature.

    --rollout-function-path dressage.rollout.sync_rollout.generate_rollout

``generate_rollout(args, rollout_id, data_source, evaluation=False)`` takes
``args.rollout_batch_size`` groups from the data source and runs every group through
:func:`dressage.rollout.group_generation.generate_group` (slime's ``generate_and_rm``: each
sample's custom generate, then the reward hook; docs/slime.md §2), all groups at once, at
most ``args.sglang_server_concurrency`` (slime's default 512) generating at a time. The run
names its hooks as slime does: ``--custom-generate-function-path`` (for agents:
``dressage.rollout.generate.blackbox_dispatch.generate``) and ``--custom-rm-path``
(``dressage.reward.custom_rm.custom_rm``). Nothing is buffered or resumed: this is the plain
synchronous recipe; partial and asynchronous rollouts plug in at the same seam
(``dressage.rollout.partial_async_rollout``). slime's ``--dynamic-sampling-filter-path`` (DAPO,
e.g. :func:`dressage.rollout.filters.nonzero_reward_std`) is honoured: rejected groups are left
out and fresh prompts generated in their place until the batch is full.

Training returns ``RolloutFnTrainOutput(samples=groups, metrics)``: per group one entry per
prompt copy, a ``Sample`` or a list of sibling samples (a multi-segment trajectory). Evaluation
returns ``RolloutFnEvalOutput`` with, per dataset, the anchors' ``rewards``, ``truncated`` flags
and the ``samples``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dressage.rollout.filters import filter_verdict
from dressage.rollout.group_generation import GroupResult, generate_group, sampling_params_from_args
from dressage.slime.hooks import load_function
from dressage.slime.rollout_args import rollout_args
from dressage.slime.sample_meta import DATASET
from dressage.types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample

__all__ = ["generate_rollout", "run_coroutine"]

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, even when this thread has a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dressage-rollout") as pool:
        return pool.submit(asyncio.run, coro).result()


async def _generate_groups(
    args: Any, groups: list[list[Sample]], evaluation: bool
) -> list[GroupResult]:
    limit = rollout_args(args).sglang_server_concurrency
    semaphore = asyncio.Semaphore(max(limit // max(_group_size(groups), 1), 1))
    params = sampling_params_from_args(args)

    async def one(group: list[Sample]) -> GroupResult:
        async with semaphore:  # whole groups: a group's samples generate together
            return await generate_group(args, group, params, evaluation=evaluation)

    tasks = [asyncio.ensure_future(one(group)) for group in groups]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:  # one raised: do not leave the others running on a closing loop
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _group_size(groups: list[list[Sample]]) -> int:
    return max((len(g) for g in groups), default=1)


def _anchors(entries: Sequence[Sample | list[Sample]]) -> list[Sample]:
    return [e[-1] if isinstance(e, list) else e for e in entries]


def _eval_output(groups: list[GroupResult]) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = {}
    for group in groups:
        for anchor, entry in zip(_anchors(group), group, strict=True):
            name = str(anchor.metadata.get(DATASET) or "default")
            out = data.setdefault(name, {"rewards": [], "truncated": [], "samples": []})
            out["rewards"].append(anchor.reward)
            out["truncated"].append(anchor.status == Sample.Status.TRUNCATED)
            out["samples"].append(entry)
    return data


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function: one batch of ``args.rollout_batch_size`` prompt groups."""
    start = time.perf_counter()
    view = rollout_args(args)
    batch = view.rollout_batch_size
    groups = data_source.get_samples(batch)
    results = run_coroutine(_generate_groups(args, groups, evaluation))
    metrics = {
        "perf/rollout_generate_time": time.perf_counter() - start,
        "rollout/prompts": float(len(groups)),
    }
    if evaluation:
        return RolloutFnEvalOutput(data=_eval_output(results), metrics=metrics)
    path = view.dynamic_sampling_filter_path
    if path:
        results = _refill(args, data_source, results, batch, load_function(path), metrics)
        metrics["perf/rollout_generate_time"] = time.perf_counter() - start
    return RolloutFnTrainOutput(samples=results, metrics=metrics)


MAX_FILTERED_ROUNDS = 20
"""Rounds of regeneration a dynamic sampling filter may force before the call fails."""


def _refill(
    args: Any,
    data_source: Any,
    results: list[GroupResult],
    batch: int,
    keep: Callable[..., Any],
    metrics: dict[str, float],
) -> list[GroupResult]:
    """slime's dynamic sampling on one synchronous batch: groups the filter rejects are left
    out and as many fresh prompts generated again, round after round, until ``batch`` are kept.
    A rejected group marked ``keep_when_insufficient`` is kept when the round's remaining
    groups could not fill the batch without it (no round is started for it, as in slime)."""
    kept: list[GroupResult] = []
    for round_ in range(MAX_FILTERED_ROUNDS + 1):
        for k, group in enumerate(results):
            short = len(kept) + len(results) - k - 1 < batch
            if filter_verdict(keep, args, group, short=short, metrics=metrics, prefix="rollout/"):
                kept.append(group)
        if len(kept) >= batch:
            return kept[:batch]
        if round_ == MAX_FILTERED_ROUNDS:
            break
        more = data_source.get_samples(batch - len(kept))
        metrics["rollout/prompts"] += len(more)
        results = run_coroutine(_generate_groups(args, more, False))
    path = rollout_args(args).dynamic_sampling_filter_path
    raise RuntimeError(
        f"sync rollout: --dynamic-sampling-filter-path {path} left {len(kept)} of {batch} groups "
        f"after {MAX_FILTERED_ROUNDS} rounds of regeneration (does every group get the same "
        "reward?)"
    )
