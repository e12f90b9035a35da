"""Generate one prompt group and score it: slime's ``generate_and_rm`` for dressage's rollouts.

    params = sampling_params_from_args(args)
    group = await generate_group(args, data_source.get_samples(1)[0], params)

Per sample, as slime's default rollout does it (docs/slime.md §2, §8.2): the generate
function is ``sample.generate_function_path``, else ``--custom-generate-function-path`` (loaded
with slime's last-dot rule; it must be a coroutine function, called with ``evaluation=`` when
its signature has that parameter) and gets its own copy of the sampling parameters; a sample
already COMPLETED or TRUNCATED (a partial rollout's buffer) is kept as it is. The result is a
``Sample`` or a list of siblings (one per segment of an agent's trajectory), passed through
slime's ``--rollout-sample-hook-path`` hooks when set. Then the reward: ``sample.custom_rm_path``
or ``--custom-rm-path`` for a sample; for a list, ``--custom-rm-path`` once with the unscored
siblings (each sample's own function without it), and nothing when any sibling is ABORTED;
with ``--group-rm`` one call for the whole group, one reward per entry. Samples that already
have a reward and ABORTED ones are not scored. The group keeps slime's shape: one entry per
prompt copy, a ``Sample`` or a list of siblings. The tier test
tests/real_slime/test_group_generation_parity.py runs this and slime's ``generate_and_rm_group``
side by side.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from dressage.slime.hooks import load_function
from dressage.slime.rollout_args import rollout_args
from dressage.slime.sample_meta import describe
from dressage.types import Sample

__all__ = ["GroupResult", "generate_group", "leaves", "sampling_params_from_args"]

GroupResult = list[Sample | list[Sample]]


def sampling_params_from_args(args: Any) -> dict[str, Any]:
    """slime's default ``sampling_params`` (§8.2) from ``--rollout-*`` flags."""
    view = rollout_args(args)
    params: dict[str, Any] = {
        "temperature": view.rollout_temperature,
        "top_p": view.rollout_top_p,
        "top_k": view.rollout_top_k,
        "max_new_tokens": view.rollout_max_response_len,
        "stop": view.rollout_stop,
        "stop_token_ids": view.rollout_stop_token_ids,
        "skip_special_tokens": view.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if params["top_p"] != 1.0:  # the engine returns each token's nucleus for top-p replay
        params["custom_params"] = {"return_top_p_token_ids": True}
    return params


def leaves(items: Iterable[Any]) -> list[Sample]:
    """Every ``Sample`` of a (nested) group, in order."""
    out: list[Sample] = []
    for item in items:
        if isinstance(item, list | tuple):
            out += leaves(item)
        else:
            out.append(item)
    return out


def _generate_fn(args: Any, sample: Sample) -> Any:
    path = sample.generate_function_path or rollout_args(args).custom_generate_function_path
    if not path:
        raise ValueError(
            f"{describe(sample)}: no generate function (set --custom-generate-function-path or "
            "the dataset's generate_function_path)"
        )
    fn = load_function(path)
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"generate function {path!r} must be an async function (slime awaits it)")
    return fn


async def _generate_one(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool
) -> Sample | list[Sample]:
    fn = _generate_fn(args, sample)
    params = copy.deepcopy(sampling_params)
    if "evaluation" in inspect.signature(fn).parameters:
        result = await fn(args, sample, params, evaluation=evaluation)
    else:
        result = await fn(args, sample, params)
    if isinstance(result, Sample) or (
        isinstance(result, list) and result and all(isinstance(s, Sample) for s in result)
    ):
        return result
    raise TypeError(
        f"{describe(sample)}: the generate function returned {type(result).__name__}, "
        "expected a Sample or a non-empty list of Samples"
    )


def _single_rm_fn(args: Any, sample: Sample) -> Any:
    path = sample.custom_rm_path or rollout_args(args).custom_rm_path
    if not path:
        raise ValueError(
            f"{describe(sample)}: no reward function (set --custom-rm-path or the dataset's "
            "custom_rm_path; slime's rule-based rm_type rewards are not available here)"
        )
    return load_function(path)


async def _batched_rm(args: Any, samples: list[Any]) -> list[Any]:
    """slime's ``batched_async_rm``: one call with the list when ``--custom-rm-path`` is set,
    else each sample through its own reward function."""
    path = rollout_args(args).custom_rm_path
    if path:
        rewards: list[Any] = await load_function(path)(args, samples)
        return rewards
    return list(await asyncio.gather(*(_single_rm_fn(args, s)(args, s) for s in samples)))


async def _score(args: Any, item: Sample | list[Sample]) -> None:
    """One group entry, scored as slime's ``generate_and_rm`` scores it."""
    aborted = Sample.Status.ABORTED
    if isinstance(item, list):
        if any(s.status == aborted for s in item):
            return  # slime scores none of an aborted trajectory's segments
        todo = [s for s in item if s.reward is None]
        if todo:
            for sample, reward in zip(todo, await _batched_rm(args, todo), strict=True):
                sample.reward = reward
        return
    if item.status != aborted and item.reward is None:
        item.reward = await _single_rm_fn(args, item)(args, item)


async def _score_group(args: Any, group: GroupResult) -> None:
    if not rollout_args(args).group_rm:
        await asyncio.gather(*(_score(args, item) for item in group))
        return
    # slime's --group-rm: the whole group in one call, one reward per entry (scored or not)
    if any(isinstance(item, list) for item in group):
        raise ValueError(
            "--group-rm gives one reward per group entry, but this group holds trajectories "
            "split into segments (lists of samples); score them per trajectory instead"
        )
    for sample, reward in zip(group, await _batched_rm(args, list(group)), strict=True):
        assert isinstance(sample, Sample)
        sample.reward = reward


async def _generate_or_keep(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool
) -> Sample | list[Sample]:
    """slime keeps a finished sample (a partial rollout's buffer) as it is."""
    done = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    if sample.status in done:
        if sample.reward is None and not rollout_args(args).group_rm:
            raise ValueError(f"{describe(sample)}: finished ({sample.status.value}) but unscored")
        return sample
    result = await _generate_one(args, sample, sampling_params, evaluation)
    if rollout_args(args).rollout_sample_hook_path:
        from slime.rollout.sample_hooks import apply_rollout_sample_hooks

        result = await apply_rollout_sample_hooks(args, result, evaluation=evaluation)
    return result


async def generate_group(
    args: Any,
    group: Sequence[Sample],
    sampling_params: dict[str, Any],
    *,
    evaluation: bool = False,
) -> GroupResult:
    """Run the generate function for every sample of ``group`` at once, then score them."""
    results = await asyncio.gather(
        *(_generate_or_keep(args, sample, sampling_params, evaluation) for sample in group)
    )
    out: GroupResult = list(results)
    await _score_group(args, out)
    return out
