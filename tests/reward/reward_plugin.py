"""A reward module the tests list in ``reward_modules``: importing it registers its rewards."""

from __future__ import annotations

import asyncio
from typing import Any

from dressage.reward.registry import register_reward
from dressage.types import Sample


@register_reward("test_length_parity")
async def length_parity(args: Any, sample: Sample) -> float:
    await asyncio.sleep(0)  # a real async reward (e.g. a remote judge) awaits something
    return float(len(sample.response) % 2 == 0)


@register_reward("test_bad_type")
def bad_type(args: Any, sample: Sample) -> Any:
    return "high"


@register_reward("test_dict")
def dict_reward(args: Any, sample: Sample) -> dict[str, float]:
    return {"score": 0.5, "format": 1.0}
