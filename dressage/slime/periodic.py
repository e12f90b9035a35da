"""When a periodic action (save, eval) falls: slime's ``should_run_periodic_action``.

Both drivers (``dressage.training.mopd_train`` and
``dressage.training.train_async_with_rollout_pause``) and the training job ask
:func:`periodic_action` for the rule: slime's own function where slime imports, else
:func:`should_run_periodic_action`, a local copy of its semantics (the embedded backend runs
without slime). ``tests/real_slime/test_drivers.py`` checks that the copy agrees with slime's on a
grid of rollouts, intervals and epoch lengths.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["PeriodicAction", "periodic_action", "should_run_periodic_action"]


class PeriodicAction(Protocol):
    """``(rollout_id, interval, num_rollout_per_epoch, num_rollout) -> run now?``"""

    def __call__(
        self,
        rollout_id: int,
        interval: int | None,
        num_rollout_per_epoch: int | None = None,
        num_rollout: int | None = None,
    ) -> bool: ...


def should_run_periodic_action(
    rollout_id: int,
    interval: int | None,
    num_rollout_per_epoch: int | None = None,
    num_rollout: int | None = None,
) -> bool:
    """slime's ``should_run_periodic_action`` semantics, for when slime is not importable (the
    embedded backend): never without an interval; always on the last rollout when
    ``num_rollout`` is given; otherwise after every ``interval``-th rollout and at each epoch
    end. An interval of 0 raises ZeroDivisionError, as slime's does."""
    if interval is None:
        return False
    done = rollout_id + 1
    if num_rollout is not None and done == num_rollout:
        return True
    epoch_end = num_rollout_per_epoch is not None and done % num_rollout_per_epoch == 0
    return done % interval == 0 or epoch_end


def periodic_action() -> PeriodicAction:
    """slime's ``should_run_periodic_action`` (``slime.utils.misc``), or the local copy of its
    semantics when slime is not installed."""
    try:
        from slime.utils import misc
    except ImportError:
        return should_run_periodic_action
    should_run: PeriodicAction = misc.should_run_periodic_action
    return should_run
