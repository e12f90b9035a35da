"""dressage.types: slime's Sample when slime is importable, else a local class with its fields.

The local class is checked field for field against ``tests/contracts/slime.json`` (whose list the
real-slime tier checks against slime's own ``Sample``), and for behaviour here; the tier also
runs the behaviours below on both classes side by side (tests/real_slime/test_sample_parity.py).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from dressage.types import SLIME_AVAILABLE, RolloutFnTrainOutput, Sample
from dressage.types import _LocalSample as LocalSample
from tests.training.slime_contract import contract

pytestmark = pytest.mark.unit


def _default(f: dataclasses.Field) -> object:  # type: ignore[type-arg]
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return type(value).__name__.lstrip("_") if dataclasses.is_dataclass(value) else value
    value = f.default
    return value.value if isinstance(value, LocalSample.Status) else value


def test_fields_names_order_and_defaults() -> None:
    got = [[f.name, _default(f)] for f in dataclasses.fields(LocalSample)]
    assert got == contract()["sample_fields"]


def test_status_values() -> None:
    assert {s.name: s.value for s in LocalSample.Status} == contract()["sample_statuses"]
    assert [s.value for s in LocalSample.Status] == [
        "pending",
        "completed",
        "truncated",
        "aborted",
        "failed",
    ]


def test_to_dict_from_dict_round_trip_keeps_unknown_keys() -> None:
    s = LocalSample(index=4, prompt=[{"role": "user", "content": "hi"}], reward={"acc": 1.0})
    s.status = LocalSample.Status.COMPLETED
    d = s.to_dict()
    assert d["status"] == "completed" and isinstance(d["spec_info"], dict)
    d["extra_key"] = 7
    back = LocalSample.from_dict(d)
    assert back.status is LocalSample.Status.COMPLETED
    assert back.extra_key == 7  # type: ignore[attr-defined]
    assert dataclasses.replace(back) == s


def test_get_reward_value_with_and_without_reward_key() -> None:
    assert LocalSample(reward=0.5).get_reward_value(SimpleNamespace(reward_key=None)) == 0.5
    s = LocalSample(reward={"acc": 1.0, "fmt": 0.0})
    assert s.get_reward_value(SimpleNamespace(reward_key="acc")) == 1.0
    with pytest.raises(TypeError, match="reward-key"):
        LocalSample(reward=1.0).get_reward_value(SimpleNamespace(reward_key="acc"))


def test_append_response_tokens_masks_logprobs_and_status() -> None:
    s = LocalSample(index=1, tokens=[10, 11], response_length=0)
    s.append_response_tokens(tokens=[1, 2], log_probs=[-0.1, -0.2], text="ab")
    s.append_response_tokens(tokens=[3], trainable=False)
    s.append_response_tokens(
        tokens=[4],
        log_probs=[-0.3],
        meta_info={"finish_reason": {"type": "length"}, "weight_version": 7},
    )
    assert s.tokens == [10, 11, 1, 2, 3, 4]
    assert s.response_length == 4 and s.response == "ab"
    assert s.loss_mask == [1, 1, 0, 1]
    assert s.rollout_log_probs == [-0.1, -0.2, 0.0, -0.3]
    assert s.status is LocalSample.Status.TRUNCATED and s.weight_versions == [7]
    assert s.effective_response_length == 3


def test_append_response_tokens_rejects_misuse() -> None:
    with pytest.raises(ValueError, match="need log_probs"):
        LocalSample().append_response_tokens(tokens=[1])
    with pytest.raises(ValueError, match="must not carry log_probs"):
        LocalSample().append_response_tokens(tokens=[1], log_probs=[-1.0], trainable=False)
    existing = LocalSample(tokens=[1], response_length=1)
    with pytest.raises(ValueError, match="back-fill"):
        existing.append_response_tokens(tokens=[2], log_probs=[-1.0])


def test_backfill_for_non_trainable_append() -> None:
    s = LocalSample(tokens=[1, 2], response_length=2)
    s.append_response_tokens(tokens=[3], trainable=False)
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [0.0, 0.0, 0.0]


def test_finish_reason_maps_to_status() -> None:
    for kind, status in [("stop", "completed"), ("abort", "aborted"), ("length", "truncated")]:
        s = LocalSample()
        finish = {"finish_reason": {"type": kind}}
        s.append_response_tokens(tokens=[1], log_probs=[-1.0], meta_info=finish)
        assert s.status.value == status
    with pytest.raises(TypeError, match="finish_reason"):
        LocalSample().append_response_tokens(
            tokens=[1], log_probs=[-1.0], meta_info={"finish_reason": "stop"}
        )


def test_rollout_output_type() -> None:
    out = RolloutFnTrainOutput(samples=[[Sample()]])
    assert out.metrics is None and len(out.samples) == 1
    assert isinstance(SLIME_AVAILABLE, bool)
