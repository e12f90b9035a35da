"""Contract: dressage.types.Sample matches slime's Sample (reference/slime.md §1)."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

from dressage.types import SLIME_AVAILABLE, RolloutFnTrainOutput, Sample
from tests.helpers import SHARED

pytestmark = pytest.mark.unit

# (name, default) in declaration order, as reference/slime.md §1.1 lists them.
EXPECTED_FIELDS = [
    ("group_index", None),
    ("index", None),
    ("rollout_id", None),
    ("prompt", ""),
    ("tokens", []),
    ("multimodal_inputs", None),
    ("multimodal_train_inputs", None),
    ("multimodal_train_input_id", None),
    ("apply_chat_template_kwargs", {}),
    ("response", ""),
    ("response_length", 0),
    ("label", None),
    ("reward", None),
    ("loss_mask", None),
    ("weight_versions", []),
    ("rollout_log_probs", None),
    ("rollout_top_p_token_ids", None),
    ("rollout_top_p_token_offsets", None),
    ("rollout_routed_experts", None),
    ("remove_sample", False),
    ("teacher_log_probs", None),
    ("status", "pending"),
    ("metadata", {}),
    ("generate_function_path", None),
    ("custom_rm_path", None),
    ("train_metadata", None),
    ("session_id", None),
    ("non_generation_time", 0.0),
    ("spec_info", "SpecInfo"),
    ("prefix_cache_info", "PrefixCacheInfo"),
]


def _default(f: dataclasses.Field) -> object:  # type: ignore[type-arg]
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return type(value).__name__.lstrip("_") if dataclasses.is_dataclass(value) else value
    value = f.default
    return value.value if isinstance(value, Sample.Status) else value


def test_fields_names_order_and_defaults() -> None:
    got = [(f.name, _default(f)) for f in dataclasses.fields(Sample)]
    assert got == EXPECTED_FIELDS


@pytest.mark.skipif(not (SHARED / "reference/slime.md").exists(), reason="no shared reference")
def test_field_list_matches_the_reference_document() -> None:
    text = (SHARED / "reference/slime.md").read_text()
    section = text.split("### 1.1", 1)[1].split("### 1.2", 1)[0]
    names = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    assert names == [name for name, _ in EXPECTED_FIELDS]
    statuses = text.split("### 1.2", 1)[1].split("### 1.3", 1)[0]
    pairs = dict(re.findall(r'`(\w+)="(\w+)"`', statuses))
    assert pairs == {s.name: s.value for s in Sample.Status}


def test_status_values() -> None:
    assert [s.value for s in Sample.Status] == [
        "pending",
        "completed",
        "truncated",
        "aborted",
        "failed",
    ]


def test_to_dict_from_dict_round_trip_keeps_unknown_keys() -> None:
    s = Sample(index=4, prompt=[{"role": "user", "content": "hi"}], reward={"acc": 1.0})
    s.status = Sample.Status.COMPLETED
    d = s.to_dict()
    assert d["status"] == "completed" and isinstance(d["spec_info"], dict)
    d["extra_key"] = 7
    back = Sample.from_dict(d)
    assert back.status is Sample.Status.COMPLETED
    assert back.extra_key == 7  # type: ignore[attr-defined]
    assert dataclasses.replace(back) == s


def test_get_reward_value_with_and_without_reward_key() -> None:
    assert Sample(reward=0.5).get_reward_value(SimpleNamespace(reward_key=None)) == 0.5
    s = Sample(reward={"acc": 1.0, "fmt": 0.0})
    assert s.get_reward_value(SimpleNamespace(reward_key="acc")) == 1.0
    with pytest.raises(TypeError, match="reward-key"):
        Sample(reward=1.0).get_reward_value(SimpleNamespace(reward_key="acc"))


def test_append_response_tokens_masks_logprobs_and_status() -> None:
    s = Sample(index=1, tokens=[10, 11], response_length=0)
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
    assert s.status is Sample.Status.TRUNCATED and s.weight_versions == ["7"]
    assert s.effective_response_length == 3


def test_append_response_tokens_rejects_misuse() -> None:
    with pytest.raises(ValueError, match="need log_probs"):
        Sample().append_response_tokens(tokens=[1])
    with pytest.raises(ValueError, match="must not carry log_probs"):
        Sample().append_response_tokens(tokens=[1], log_probs=[-1.0], trainable=False)
    existing = Sample(tokens=[1], response_length=1)
    with pytest.raises(ValueError, match="back-fill"):
        existing.append_response_tokens(tokens=[2], log_probs=[-1.0])


def test_backfill_for_non_trainable_append() -> None:
    s = Sample(tokens=[1, 2], response_length=2)
    s.append_response_tokens(tokens=[3], trainable=False)
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [0.0, 0.0, 0.0]


def test_finish_reason_maps_to_status() -> None:
    for kind, status in [("stop", "completed"), ("abort", "aborted"), ("length", "truncated")]:
        s = Sample()
        s.append_response_tokens(tokens=[1], log_probs=[-1.0], meta_info={"finish_reason": kind})
        assert s.status.value == status


def test_rollout_output_type() -> None:
    out = RolloutFnTrainOutput(samples=[[Sample()]])
    assert out.metrics is None and len(out.samples) == 1
    assert isinstance(SLIME_AVAILABLE, bool)
