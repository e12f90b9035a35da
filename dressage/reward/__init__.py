"""Rewards: slime's reward hook (custom_rm) over a registry of task rewards."""

from dressage.reward.registry import (
    get_reward,
    load_reward_modules,
    register_reward,
    registered_rewards,
)

__all__ = ["get_reward", "load_reward_modules", "register_reward", "registered_rewards"]
