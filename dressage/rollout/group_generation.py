"""Generate one prompt group and score it: slime's ``generate_and_rm`` for dressage's rollouts.

    params = sampling_params_from_args(args)
    group = await generate_group(args, data_source.get_samples(1)[0], params)

Per sample, as slime's default rollout does it (reference/slime.md §2, §8.2): the generate
function is ``sample.generate_function_path``, else ``--custom-generate-function-path`` (loaded
with slime's last-dot rule; it must be a coroutine function, called with ``evaluation=`` when
its signature has that parameter) and gets its own copy of the sampling parameters. It returns a
``Sample`` or a list of siblings (one per segment of an agent's trajectory). Then the reward:
``--custom-rm-path`` (or ``sample.custom_rm_path``), awaited per sample, or once per list of
siblings (and once per group with ``--group-rm``); samples that already have a reward and
ABORTED ones are not scored. The group keeps slime's shape: one entry per prompt copy, a
``Sample`` or a list of siblings.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from dressage.rollout.sample_meta import describe
from dressage.training.hooks import load_function
from dressage.types import Sample

__all__ = ["GroupResult", "generate_group", "leaves", "sampling_params_from_args"]

GroupResult = list[Sample | list[Sample]]


def sampling_params_from_args(args: Any) -> dict[str, Any]:
    """slime's default ``sampling_params`` (§8.2) from ``--rollout-*`` flags."""
    params: dict[str, Any] = {
        "temperature": float(getattr(args, "rollout_temperature", 1.0) or 1.0),
        "top_p": float(getattr(args, "rollout_top_p", 1.0) or 1.0),
        "top_k": int(getattr(args, "rollout_top_k", -1) or -1),
        "max_new_tokens": getattr(args, "rollout_max_response_len", None),
        "stop": getattr(args, "rollout_stop", None),
        "stop_token_ids": getattr(args, "rollout_stop_token_ids", None),
        "skip_special_tokens": bool(getattr(args, "rollout_skip_special_tokens", False)),
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
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
    path = sample.generate_function_path or getattr(args, "custom_generate_function_path", None)
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


def _needs_reward(sample: Sample) -> bool:
    return sample.reward is None and sample.status != Sample.Status.ABORTED


async def _score(args: Any, item: Sample | list[Sample]) -> None:
    if isinstance(item, list):
        todo = [s for s in item if _needs_reward(s)]
        if not todo:
            return
        path = getattr(args, "custom_rm_path", None)
        if not path:
            return
        rewards = await load_function(path)(args, todo)
        for sample, reward in zip(todo, rewards, strict=True):
            sample.reward = reward
        return
    if not _needs_reward(item):
        return
    path = item.custom_rm_path or getattr(args, "custom_rm_path", None)
    if path:
        item.reward = await load_function(path)(args, item)


async def _score_group(args: Any, group: GroupResult) -> None:
    if getattr(args, "group_rm", False):
        todo = [s for s in leaves(group) if _needs_reward(s)]
        path = getattr(args, "custom_rm_path", None)
        if todo and path:
            rewards = await load_function(path)(args, todo)
            for sample, reward in zip(todo, rewards, strict=True):
                sample.reward = reward
        return
    await asyncio.gather(*(_score(args, item) for item in group))


async def generate_group(
    args: Any,
    group: Sequence[Sample],
    sampling_params: dict[str, Any],
    *,
    evaluation: bool = False,
) -> GroupResult:
    """Run the generate function for every sample of ``group`` at once, then score them."""
    results = await asyncio.gather(
        *(_generate_one(args, sample, sampling_params, evaluation) for sample in group)
    )
    out: GroupResult = list(results)
    await _score_group(args, out)
    return out
