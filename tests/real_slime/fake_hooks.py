"""Generate and reward hooks for the group-generation parity test, loaded by dotted path.

``generate`` plays an agent from the sample's ``metadata["script"]``: ``one`` returns the sample
completed; ``split`` returns two sibling samples (a trajectory in two segments); ``aborted``
and ``split_aborted`` end ABORTED; ``prescored`` fills the reward itself. ``rm`` scores a
sample or a list and records each call's shape in ``CALLS``.
"""

from __future__ import annotations

import copy
from typing import Any

CALLS: list[Any] = []


def _done(sample: Any, status: str, text: str) -> Any:
    sample.response = text
    sample.tokens = [*sample.tokens, len(text)]
    sample.response_length += 1
    sample.status = type(sample).Status(status)
    return sample


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    script = sample.metadata["script"]
    if script == "one":
        return _done(sample, "completed", f"answer-{sample.index}")
    if script == "aborted":
        return _done(sample, "aborted", "cut")
    if script == "prescored":
        sample.reward = 0.25
        return _done(sample, "completed", "self-scored")
    first = _done(copy.deepcopy(sample), "completed", "segment-0")
    last = _done(
        copy.deepcopy(sample), "aborted" if script == "split_aborted" else "completed", "s1"
    )
    first.rollout_id = last.rollout_id = sample.index
    return [first, last]


def _reward(sample: Any) -> float:
    return float(len(sample.response)) + (sample.index or 0) / 10


async def rm(args: Any, sample: Any, **kwargs: Any) -> Any:
    if isinstance(sample, list):
        CALLS.append(("list", [s.response for s in sample]))
        return [_reward(s) for s in sample]
    CALLS.append(("one", sample.response))
    return _reward(sample)


async def other_rm(args: Any, sample: Any, **kwargs: Any) -> float:
    """A dataset's own ``custom_rm_path``."""
    CALLS.append(("other", sample.response))
    return -1.0
