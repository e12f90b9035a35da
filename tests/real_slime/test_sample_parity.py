"""The local ``Sample`` (used where slime is not importable) behaves as slime's own ``Sample``.

Each scenario runs on a fresh instance of both classes: on valid input both must end in the same
state (``to_dict``); on input slime refuses, the local class must refuse too.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_sample_parity.py
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from dressage.types import _LocalSample as LocalSample

pytestmark = pytest.mark.unit

ARGS = SimpleNamespace(reward_key=None)

SCENARIOS: dict[str, Callable[[Any], Any]] = {
    "trainable append": lambda s: s.append_response_tokens(tokens=[1, 2], log_probs=[-0.1, -0.2]),
    "tool tokens": lambda s: s.append_response_tokens(tokens=[3], trainable=False),
    "text": lambda s: s.append_response_tokens(tokens=[1], log_probs=[-1.0], text="ab"),
    "finish length": lambda s: s.append_response_tokens(
        tokens=[4], log_probs=[-0.3], meta_info={"finish_reason": {"type": "length"}}
    ),
    "finish stop with version": lambda s: s.append_response_tokens(
        tokens=[4],
        log_probs=[-0.3],
        meta_info={"finish_reason": {"type": "stop"}, "weight_version": 7},
    ),
    "finish abort": lambda s: s.append_response_tokens(
        tokens=[4], log_probs=[-0.3], meta_info={"finish_reason": {"type": "abort"}}
    ),
    "finish reason as a bare string": lambda s: s.append_response_tokens(
        tokens=[4], log_probs=[-0.3], meta_info={"finish_reason": "stop"}
    ),
    "trainable without log-probs": lambda s: s.append_response_tokens(tokens=[1]),
    "tool tokens with log-probs": lambda s: s.append_response_tokens(
        tokens=[1], log_probs=[-1.0], trainable=False
    ),
    "log-prob count mismatch": lambda s: s.append_response_tokens(tokens=[1, 2], log_probs=[-1.0]),
    "reward value": lambda s: setattr(s, "reward", 0.5) or s.get_reward_value(ARGS),
    "reward by key": lambda s: (
        setattr(s, "reward", {"acc": 1.0}) or s.get_reward_value(SimpleNamespace(reward_key="acc"))
    ),
    "to_dict/from_dict": lambda s: type(s).from_dict({**s.to_dict(), "extra": 3}).to_dict(),
    "effective length": lambda s: (
        s.append_response_tokens(tokens=[1, 2], log_probs=[-0.1, -0.2]),
        s.append_response_tokens(tokens=[3], trainable=False),
        s.effective_response_length,
    )[-1],
}

PRESETS = {
    "empty": {},
    "with prompt": {"index": 1, "tokens": [10, 11], "response_length": 0},
    "with response": {"index": 2, "tokens": [10, 11, 12], "response_length": 1},
}


def _outcome(cls: type, preset: dict[str, Any], scenario: Callable[[Any], Any]) -> Any:
    sample = cls(**copy.deepcopy(preset))
    try:
        value = scenario(sample)
    except (ValueError, TypeError, KeyError, AssertionError):
        return "refused"
    state = sample.to_dict()
    state["status"] = str(state["status"])
    return {"value": value, "state": state}


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_local_sample_matches_slimes(name: str, preset: str) -> None:
    from slime.utils.types import Sample

    want = _outcome(Sample, PRESETS[preset], SCENARIOS[name])
    got = _outcome(LocalSample, PRESETS[preset], SCENARIOS[name])
    if want == "refused":
        assert got == "refused", f"slime refuses {name!r}; the local class accepted it"
    else:
        assert got == want
