"""★ slime's reward post-process hook for multi-segment rollouts.

    --custom-reward-post-process-path dressage.training.reward_post_process.reward_post_process

One value per rollout (its anchor's), grouped by prompt, normalised as slime's estimator asks
and broadcast to the rollout's siblings: :mod:`dressage.slime.rewards` has the rules, which the
converter (``dressage.rollout.convert_samples``) applies on the layout it builds anyway.
"""

from __future__ import annotations

from typing import Any

from dressage.slime.args import slime_args
from dressage.slime.layout import build_layout, read_columns
from dressage.slime.rewards import post_process_rewards
from dressage.types import Sample

__all__ = ["reward_post_process"]


def reward_post_process(args: Any, samples: list[Sample]) -> tuple[list[float], list[float]]:
    """slime hook: ``(raw_rewards, rewards)`` for the flat batch ``samples``."""
    view = slime_args(args)
    columns = read_columns(samples)
    layout = build_layout(samples, need_prompts=view.normalizes_rewards, columns=columns)
    return post_process_rewards(view, samples, layout, columns=columns)
