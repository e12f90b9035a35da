"""Optimizer steps and micro-batches, grouped by rollout the way slime's DP schedule groups them.

One rank, no DP (docs/slime.md §5): sample positions are grouped by ``rollout_id`` in
first-occurrence order; ``global_batch_size`` counts **rollouts**; each step takes the next
``global_batch_size`` rollouts with all their samples, so siblings never straddle a step;
trailing rollouts that do not fill a step are dropped. Each step is packed into micro-batches:
chunks of ``micro_batch_size`` samples, or first-fit bins of at most ``max_tokens_per_gpu``
tokens with ``use_dynamic_batch_size``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Schedule", "TrainStep", "build_schedule"]


@dataclass(frozen=True)
class TrainStep:
    """One optimizer step; positions index the scheduled (local) samples."""

    micro_batches: list[list[int]]
    num_rollouts: int

    @property
    def positions(self) -> list[int]:
        return [i for mb in self.micro_batches for i in mb]


@dataclass(frozen=True)
class Schedule:
    order: list[int]
    """Positions into train_data of the samples that train, in local order."""
    steps: list[TrainStep]
    dropped: list[int]
    """Positions into train_data of trailing rollouts' samples (not trained, as in slime)."""


def _first_fit(
    positions: Sequence[int], lengths: Mapping[int, int], budget: int
) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in positions:
        for b, load in enumerate(loads):
            if load + lengths[i] <= budget:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def build_schedule(
    rollout_ids: Sequence[int],
    total_lengths: Sequence[int],
    *,
    global_batch_size: int,
    micro_batch_size: int | None = 1,
    max_tokens_per_gpu: int | None = None,
) -> Schedule:
    """Steps of ``global_batch_size`` rollouts; ``max_tokens_per_gpu`` selects dynamic batching.

    Raises:
        ValueError: fewer rollouts than one step, or no micro-batch size.
    """
    if global_batch_size is None or int(global_batch_size) < 1:
        raise ValueError(f"global_batch_size must be a positive rollout count: {global_batch_size}")
    groups: dict[int, list[int]] = {}
    for i, rid in enumerate(rollout_ids):
        groups.setdefault(int(rid), []).append(i)
    rollouts = list(groups.values())
    gbs = int(global_batch_size)
    num_steps = len(rollouts) // gbs
    if num_steps == 0:
        raise ValueError(
            f"train_data has {len(rollouts)} rollouts, fewer than global_batch_size {gbs}: "
            "no optimizer step can be formed"
        )
    order: list[int] = []
    steps: list[TrainStep] = []
    for s in range(num_steps):
        members = [i for group in rollouts[s * gbs : (s + 1) * gbs] for i in group]
        local = list(range(len(order), len(order) + len(members)))
        lengths = {loc: int(total_lengths[g]) for loc, g in zip(local, members, strict=True)}
        order += members
        if max_tokens_per_gpu:
            mbs = _first_fit(local, lengths, int(max_tokens_per_gpu))
        elif micro_batch_size:
            size = int(micro_batch_size)
            mbs = [local[k : k + size] for k in range(0, len(local), size)]
        else:
            raise ValueError("set micro_batch_size, or max_tokens_per_gpu with dynamic batching")
        steps.append(TrainStep(micro_batches=mbs, num_rollouts=gbs))
    dropped = [i for group in rollouts[num_steps * gbs :] for i in group]
    return Schedule(order=order, steps=steps, dropped=dropped)
