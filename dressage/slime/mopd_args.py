"""A typed view of the MOPD flags (``dressage.training.mopd_train.add_mopd_arguments``) and the
slime options the MOPD objectives depend on.

:func:`mopd_args` reads them once from slime's ``args``. A Namespace that never registered the
MOPD flags (a plain slime command naming dressage's hooks) reads as this view's defaults, which
are the hooks' readings of an absent flag: ``sampled`` for the objective (the parser's default is
``dressage.config.run.DEFAULT_MOPD_OBJECTIVE``), and None for the top-k width and the advantage
clip (their modules' defaults apply: ``dressage.config.run.DEFAULT_MOPD_TOPK``,
``dressage.training.mopd_loss.DEFAULT_ADVANTAGE_CLIP``). Values are read, not checked:
``mopd_objective()`` and ``mopd_topk()`` in ``dressage.training`` check them, and
``dressage.config.mopd.slime_objective_problems`` checks the objective before launch from this
same reading, so that what is checked is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MOPD_RESTORES", "MopdArgs", "mopd_args"]

MOPD_RESTORES = ("streamed", "slime")
"""``--mopd-restore``'s choices, the default first."""


@dataclass(frozen=True)
class MopdArgs:
    mopd_objective: str = "sampled"
    """``--mopd-objective`` as given (None or "" read as ``sampled``), not yet checked."""
    mopd_topk: int | None = None
    mopd_forward_kl_weight: float = 0.0
    """0 or None: the reverse KL alone."""
    mopd_advantage_clip: float | None = None
    mopd_defer_rollout_metrics: bool = False
    """Set by dressage's slime actor: the advantage hook leaves the per-teacher metrics to it."""
    mopd_config: str | None = None
    mopd_metrics_dir: str | None = None
    mopd_restore: str = MOPD_RESTORES[0]
    """How the actor restores a teacher or the student: ``streamed`` or ``slime``."""
    allgather_cp: bool = False
    """slime's ``--allgather-cp``, which the top-k objective refuses."""
    rollout_top_p: float = 1.0
    """slime's ``--rollout-top-p`` (None reads as 1.0, 0 stays 0), which top-k needs at 1."""


def mopd_args(args: Any) -> MopdArgs:
    """Read :class:`MopdArgs` from slime's ``args`` (any object with attributes)."""
    k = getattr(args, "mopd_topk", None)
    clip = getattr(args, "mopd_advantage_clip", None)
    top_p = getattr(args, "rollout_top_p", None)
    return MopdArgs(
        mopd_objective=getattr(args, "mopd_objective", None) or "sampled",
        mopd_topk=None if k is None else int(k),
        mopd_forward_kl_weight=float(getattr(args, "mopd_forward_kl_weight", 0.0) or 0.0),
        mopd_advantage_clip=None if clip is None else float(clip),
        mopd_defer_rollout_metrics=bool(getattr(args, "mopd_defer_rollout_metrics", False)),
        mopd_config=getattr(args, "mopd_config", None),
        mopd_metrics_dir=getattr(args, "mopd_metrics_dir", None),
        mopd_restore=getattr(args, "mopd_restore", None) or MOPD_RESTORES[0],
        allgather_cp=bool(getattr(args, "allgather_cp", False)),
        rollout_top_p=1.0 if top_p is None else float(top_p),
    )
