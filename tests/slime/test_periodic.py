"""dressage.slime.periodic: the local copy of slime's periodic-action rule (the real-slime tier,
tests/real_slime/test_drivers.py, checks it against slime's own function)."""

from __future__ import annotations

import pytest

from dressage.slime.periodic import periodic_action, should_run_periodic_action

pytestmark = pytest.mark.unit


def test_every_interval_and_never_without_one() -> None:
    runs = [r for r in range(10) if should_run_periodic_action(r, 3)]
    assert runs == [2, 5, 8]  # after the 3rd, 6th and 9th rollout
    assert not any(should_run_periodic_action(r, None) for r in range(10))


def test_epoch_ends_and_the_last_rollout_also_run() -> None:
    runs = [r for r in range(10) if should_run_periodic_action(r, 4, num_rollout_per_epoch=3)]
    assert runs == [2, 3, 5, 7, 8]
    assert should_run_periodic_action(9, 4, num_rollout=10)
    assert not should_run_periodic_action(8, 4, num_rollout=10)


def test_a_zero_interval_fails_as_slimes_does() -> None:
    with pytest.raises(ZeroDivisionError):
        should_run_periodic_action(0, 0)


def test_without_slime_the_local_rule_is_used() -> None:
    try:
        import slime.utils.misc  # noqa: F401
    except ImportError:
        assert periodic_action() is should_run_periodic_action
    else:
        assert periodic_action() is not should_run_periodic_action
