"""Hooks for the partial-async rollout tests, loaded by dotted path as slime would load them.

``generate`` stands in for an agent whose weights change while it runs: it writes one response
token under the version current when it starts and one under the version current when it ends
(``VERSION`` is what the version source reports), sleeping in between, so a group that carries
over a version change holds tokens of two versions.
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

from dressage.slime.sample_meta import record_written, version_metadata
from dressage.types import Sample

VERSION = {"current": 0}
FAIL_INDEX = {"index": -1}


def version() -> int:
    return VERSION["current"]


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    assert sampling_params["temperature"] == 1.0  # slime's defaults reach the hook
    if sample.index == FAIL_INDEX["index"]:
        raise RuntimeError(f"agent of sample {sample.index} crashed")
    first = VERSION["current"]
    await asyncio.sleep(0.02 + 0.01 * (sample.index % 5))
    last = VERSION["current"]
    sample.tokens = [11, 12, 13, 14]
    sample.response_length = 2
    sample.loss_mask = [1, 1]
    sample.rollout_log_probs = [-0.5, -0.5]
    versions = [-1, -1, first, last]
    meta, distinct = version_metadata(versions[2:])
    sample.metadata.update(meta, full_versions=versions)
    sample.weight_versions = [str(v) for v in distinct]
    sample.rollout_id = sample.index
    sample.status = Sample.Status.COMPLETED
    record_written(sample, 2)
    return sample


async def reward(args: Any, sample: Any) -> Any:
    if isinstance(sample, list):
        return [1.0 for _ in sample]
    return 1.0 + sample.index / 1000


class ListDataSource:
    """slime's DataSource surface over endless numbered prompts; requeued groups come first."""

    def __init__(self, n_samples_per_prompt: int = 2) -> None:
        self.n = n_samples_per_prompt
        self.buffer: list[list[Sample]] = []
        self.requeued: list[list[Sample]] = []
        self.group_index = 0
        self.index = 0

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = self.buffer[:num_samples]
        del self.buffer[:num_samples]
        while len(groups) < num_samples:
            template = Sample(prompt=f"prompt {self.group_index}", group_index=self.group_index)
            group = []
            for _ in range(self.n):
                copy_ = copy.deepcopy(template)
                copy_.index = self.index
                self.index += 1
                group.append(copy_)
            self.group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> None:
        assert all(len(g) == self.n for g in samples)
        self.requeued += copy.deepcopy(samples)
        self.buffer += samples


async def reward_odd_groups_vary(args: Any, sample: Any) -> Any:
    """Rewards that differ only inside odd groups (even groups: all 0, zero spread)."""
    if isinstance(sample, list):
        return [float(s.group_index % 2 * (s.index % 2)) for s in sample]
    return float(sample.group_index % 2 * (sample.index % 2))


def reject_every_group(args: Any, group: list[Sample]) -> bool:
    """A filter in slime's legacy form (a bare bool) that never keeps anything."""
    return False


def rollout_args(**overrides: Any) -> SimpleNamespace:
    """slime's ``args`` for a rollout over these hooks: batches of 2 groups of 2 samples."""
    hooks = __name__
    values: dict[str, Any] = {
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "dressage_async_groups_in_flight": 6,
        "custom_generate_function_path": f"{hooks}.generate",
        "custom_rm_path": f"{hooks}.reward",
        "dressage_version_source_path": f"{hooks}.version",
        "rollout_temperature": 1.0,
        "reward_key": None,  # slime's parser always sets it; its Sample reads it
    }
    values.update(overrides)
    return SimpleNamespace(**values)
