"""A small typed view of the slime ``args`` flags that dressage's hooks read.

slime hands every hook its whole argparse ``Namespace``; reading it with scattered ``getattr``
calls hides which flags matter and what their defaults are. :func:`slime_args` reads them once,
with slime's defaults (reference/slime.md §2, §4, §5), into a frozen dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GROUP_NORMALIZED_ESTIMATORS", "PROMPT_EQUAL_ESTIMATORS", "SlimeArgs", "slime_args"]

GROUP_NORMALIZED_ESTIMATORS = frozenset({"grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"})
"""Estimators whose rewards slime normalises per prompt group (reference §4.1)."""

STD_NORMALIZED_ESTIMATORS = frozenset({"grpo", "gspo", "cispo"})
"""Of those, the ones that also divide by the group std (reinforce++ baseline only centres)."""

PROMPT_EQUAL_ESTIMATORS = GROUP_NORMALIZED_ESTIMATORS
"""Estimators that get prompt-equal ``rollout_mask_sums`` (the others get slime's own)."""


@dataclass(frozen=True)
class SlimeArgs:
    advantage_estimator: str = "grpo"
    rewards_normalization: bool = True
    grpo_std_normalization: bool = True
    n_samples_per_prompt: int = 1
    reward_key: str | None = None
    max_tokens_per_gpu: int | None = None
    context_parallel_size: int = 1
    mask_offpolicy_in_partial_rollout: bool = False
    rollout_top_p: float = 1.0

    @property
    def normalizes_rewards(self) -> bool:
        return self.rewards_normalization and self.advantage_estimator in (
            GROUP_NORMALIZED_ESTIMATORS
        )

    @property
    def divides_by_std(self) -> bool:
        # slime forces --disable-grpo-std-normalization when there is one sample per prompt
        return (
            self.advantage_estimator in STD_NORMALIZED_ESTIMATORS
            and self.grpo_std_normalization
            and self.n_samples_per_prompt != 1
        )

    @property
    def prompt_equal(self) -> bool:
        return self.advantage_estimator in PROMPT_EQUAL_ESTIMATORS

    @property
    def token_cap(self) -> int | None:
        """Longest sample slime can pack: ``max_tokens_per_gpu x context-parallel size``.

        Applied whenever ``--max-tokens-per-gpu`` is set, with or without dynamic batching.
        """
        if self.max_tokens_per_gpu is None:
            return None
        return self.max_tokens_per_gpu * self.context_parallel_size


def _int_or_none(args: Any, name: str) -> int | None:
    value = getattr(args, name, None)
    return None if value is None else int(value)


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def slime_args(args: Any) -> SlimeArgs:
    """Read the flags dressage needs from slime's ``args`` (any object with attributes)."""
    cp = getattr(args, "context_parallel_size", None)
    if cp is None:
        cp = getattr(args, "cp_size", None)
    n = getattr(args, "n_samples_per_prompt", None)
    return SlimeArgs(
        advantage_estimator=str(getattr(args, "advantage_estimator", None) or "grpo"),
        rewards_normalization=bool(_default(getattr(args, "rewards_normalization", None), True)),
        grpo_std_normalization=bool(_default(getattr(args, "grpo_std_normalization", None), True)),
        n_samples_per_prompt=1 if n is None else int(n),
        reward_key=getattr(args, "reward_key", None) or None,
        max_tokens_per_gpu=_int_or_none(args, "max_tokens_per_gpu"),
        context_parallel_size=1 if cp is None else int(cp),
        mask_offpolicy_in_partial_rollout=bool(
            getattr(args, "mask_offpolicy_in_partial_rollout", False)
        ),
        rollout_top_p=float(_default(getattr(args, "rollout_top_p", None), 1.0)),
    )
