"""A small typed view of the slime ``args`` flags that dressage's hooks read.

slime hands every hook its whole argparse ``Namespace``; reading it with scattered ``getattr``
calls hides which flags matter and what their defaults are. :func:`slime_args` reads them once,
with slime's defaults (docs/slime.md §2, §4, §5), into a frozen dataclass.

Dressage's own converter flags live here too, so that every ``parse_args(add_custom_arguments=...)``
hook (``add_mopd_arguments``, ``add_rollout_pause_arguments``) registers them from one definition,
:func:`add_dressage_arguments`:

    --dressage-prompt-equal-estimators NAME [NAME ...]
        estimators that get prompt-equal loss denominators (dressage.rollout.convert_samples);
        default grpo and reinforce_plus_plus_baseline; gspo and cispo only when named here;
        ``none`` turns prompt-equal off.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_PROMPT_EQUAL_ESTIMATORS",
    "GROUP_NORMALIZED_ESTIMATORS",
    "PROMPT_EQUAL_FLAG",
    "LoopArgs",
    "SlimeArgs",
    "add_dressage_arguments",
    "loop_args",
    "slime_args",
]

GROUP_NORMALIZED_ESTIMATORS = frozenset({"grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"})
"""Estimators whose rewards slime normalises per prompt group (reference §4.1)."""

STD_NORMALIZED_ESTIMATORS = frozenset({"grpo", "gspo", "cispo"})
"""Of those, the ones that also divide by the group std (reinforce++ baseline only centres)."""

DEFAULT_PROMPT_EQUAL_ESTIMATORS = frozenset({"grpo", "reinforce_plus_plus_baseline"})
"""Estimators that get prompt-equal ``rollout_mask_sums`` unless the flag below says otherwise.

gspo and cispo are left out by design: they weigh each sequence through its own ratio (gspo's
sequence-level ratio, cispo's truncated per-token weight), so reweighting their tokens per prompt
is a choice to make per run, not a default."""

PROMPT_EQUAL_FLAG = "--dressage-prompt-equal-estimators"
"""Names the estimators that get prompt-equal denominators (args attribute below)."""

_PROMPT_EQUAL_ATTR = "dressage_prompt_equal_estimators"
_NONE = "none"


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
    prompt_equal_estimators: frozenset[str] = DEFAULT_PROMPT_EQUAL_ESTIMATORS

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
    def carries_teacher_ids(self) -> bool:
        """MOPD: the converter fills slime's ``prompt`` slot with each sample's teacher id."""
        return self.advantage_estimator == "mopd"

    @property
    def prompt_equal(self) -> bool:
        return self.advantage_estimator in self.prompt_equal_estimators

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
        prompt_equal_estimators=_prompt_equal_estimators(getattr(args, _PROMPT_EQUAL_ATTR, None)),
    )


@dataclass(frozen=True)
class LoopArgs:
    """The flags a training loop reads (slime's ``train_async.py``), with slime's defaults."""

    num_rollout: int
    start_rollout_id: int = 0
    update_weights_interval: int = 1
    save_interval: int | None = None
    eval_interval: int | None = None
    skip_eval_before_train: bool = False
    release_train: bool = False
    offload_rollout: bool = False
    """slime's parser leaves it None and its validation sets it (always on with --colocate)."""
    offload_train: bool = False
    check_weight_update_equal: bool = False
    rollout_global_dataset: bool = True
    """Off with ``--disable-rollout-global-dataset``: the data source keeps no position."""
    use_critic: bool = False
    """slime derives it: ``advantage_estimator == "ppo"``."""
    num_critic_only_steps: int = 0

    def actor_trains(self, rollout_id: int) -> bool:
        """slime's ``actor_trains``: with a critic, the actor waits ``--num-critic-only-steps``."""
        return not self.use_critic or rollout_id >= self.num_critic_only_steps


def loop_args(args: Any) -> LoopArgs:
    """Read :class:`LoopArgs` from slime's ``args``; ``num_rollout`` is required."""
    return LoopArgs(
        num_rollout=int(args.num_rollout),
        start_rollout_id=int(getattr(args, "start_rollout_id", 0) or 0),
        update_weights_interval=int(getattr(args, "update_weights_interval", 1) or 1),
        save_interval=getattr(args, "save_interval", None),
        eval_interval=getattr(args, "eval_interval", None),
        skip_eval_before_train=bool(getattr(args, "skip_eval_before_train", False)),
        release_train=bool(getattr(args, "release_train", False)),
        offload_rollout=bool(getattr(args, "offload_rollout", False)),
        offload_train=bool(getattr(args, "offload_train", False)),
        check_weight_update_equal=bool(getattr(args, "check_weight_update_equal", False)),
        rollout_global_dataset=bool(getattr(args, "rollout_global_dataset", True)),
        use_critic=bool(getattr(args, "use_critic", False)),
        num_critic_only_steps=int(getattr(args, "num_critic_only_steps", 0) or 0),
    )


def _prompt_equal_estimators(value: str | Iterable[str] | None) -> frozenset[str]:
    """The flag's names (a list from argparse, or one comma/space separated string).

    Raises:
        ValueError: a name that is not a group-normalised estimator: prompt-equal weights need
            per-prompt groups, which ppo and reinforce_plus_plus do not have.
    """
    if value is None:
        return DEFAULT_PROMPT_EQUAL_ESTIMATORS
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    names = {str(item).strip() for item in items} - {""}
    if names == {_NONE}:
        return frozenset()
    unknown = sorted(names - GROUP_NORMALIZED_ESTIMATORS)
    if unknown or not names:
        choices = ", ".join(sorted(GROUP_NORMALIZED_ESTIMATORS))
        raise ValueError(
            f"{PROMPT_EQUAL_FLAG}: {unknown or value!r} not allowed; name one or more of "
            f"{choices} (estimators with per-prompt groups), or {_NONE!r}"
        )
    return frozenset(names)


def add_dressage_arguments(parser: argparse._ActionsContainer) -> None:
    """Register dressage's converter flags on a parser or argument group.

    slime's ``parse_args(add_custom_arguments=...)`` hooks call it (the parser, or the group
    they made), so every entry point that can run the converter accepts the same flags, and
    ``--dressage-continue-from`` (:mod:`dressage.slime.continue_from`).
    """
    from dressage.slime.continue_from import add_continue_argument

    add_continue_argument(parser)
    parser.add_argument(
        PROMPT_EQUAL_FLAG,
        dest=_PROMPT_EQUAL_ATTR,
        nargs="+",
        default=None,
        choices=[*sorted(GROUP_NORMALIZED_ESTIMATORS), _NONE],
        metavar="ESTIMATOR",
        help="estimators with prompt-equal loss denominators (default: "
        f"{' '.join(sorted(DEFAULT_PROMPT_EQUAL_ESTIMATORS))}; gspo/cispo only when named; "
        f"{_NONE!r} for none)",
    )
