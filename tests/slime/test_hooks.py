"""dressage.slime.hooks: dotted hook paths resolve as slime's load_function resolves them."""

from __future__ import annotations

import pytest

from dressage.slime.hooks import load_function

pytestmark = pytest.mark.unit


def test_hooks_resolve_like_slimes_load_function() -> None:
    assert load_function("dressage.training.mopd_loss.mopd_policy_loss").__name__ == (
        "mopd_policy_loss"
    )
    with pytest.raises(ValueError, match="dotted"):
        load_function("dressage/training/mopd_loss.py:mopd_policy_loss")
    with pytest.raises(AttributeError, match="has no 'nope'"):
        load_function("dressage.training.mopd_loss.nope")
    with pytest.raises(ImportError, match="cannot import module 'dressage.nowhere'"):
        load_function("dressage.nowhere.fn")
