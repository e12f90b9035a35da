"""The reward of the ``double`` task, registered by name.

The MOPD config lists this module in ``reward_modules``; importing it registers the function,
and the reward hook scores every row whose ``metadata.task`` is ``double`` with it.
"""

from __future__ import annotations

from typing import Any

from dressage.reward.builtin import final_answer, parse_number
from dressage.reward.registry import register_reward


@register_reward("double")
def double(args: Any, sample: Any) -> float:
    """1.0 when the agent's final answer is the label as a number, else 0.0."""
    answer = parse_number(final_answer(sample.response or ""))
    return 1.0 if answer is not None and answer == parse_number(str(sample.label)) else 0.0
