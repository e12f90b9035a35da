"""Megatron's model flags derived from a Hugging Face config.json (dressage.slime.model_flags).

slime's own check of these flags against the checkpoint runs in
tests/real_slime/test_megatron_parts.py; here, what the flags say and what is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dressage.slime.model_flags import ModelFlagsError, main, megatron_model_flags

pytestmark = pytest.mark.unit

QWEN3_06B: dict[str, Any] = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def _value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_qwen3_flags_are_slimes_example_for_the_model() -> None:
    flags = megatron_model_flags(QWEN3_06B)
    expected = {
        "--num-layers": "28",
        "--hidden-size": "1024",
        "--ffn-hidden-size": "3072",
        "--num-attention-heads": "16",
        "--num-query-groups": "8",
        "--kv-channels": "128",
        "--vocab-size": "151936",
        "--make-vocab-size-divisible-by": "128",
        "--norm-epsilon": "1e-06",
        "--rotary-base": "1000000",
        "--normalization": "RMSNorm",
    }
    assert {k: _value(flags, k) for k in expected} == expected
    switches = ("--swiglu", "--qk-layernorm", "--group-query-attention", "--disable-bias-linear")
    assert all(switch in flags for switch in switches)
    assert "--untie-embeddings-and-output-weights" not in flags  # tied
    assert "--add-qkv-bias" not in flags


def test_untied_qwen2_gets_qkv_bias_and_no_qk_norm() -> None:
    config = {**QWEN3_06B, "model_type": "qwen2", "tie_word_embeddings": False}
    config.pop("head_dim")
    flags = megatron_model_flags(config)
    assert "--add-qkv-bias" in flags and "--qk-layernorm" not in flags
    assert "--untie-embeddings-and-output-weights" in flags
    assert _value(flags, "--kv-channels") == "64"  # hidden / heads without head_dim


def test_rope_theta_from_rope_parameters(tmp_path: Path) -> None:
    config = {**QWEN3_06B, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    config.pop("rope_theta")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _value(megatron_model_flags(tmp_path), "--rotary-base") == "500000"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model_type": "deepseek_v3"}, "model_type 'deepseek_v3' is not supported"),
        ({"num_experts": 8}, "num_experts=8: mixtures of experts"),
        ({"use_sliding_window": True, "sliding_window": 4096}, "sliding-window"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "rope_type 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rms_norm_eps": None}, None),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], words: str | None) -> None:
    config = {**QWEN3_06B, **change}
    if words is None:
        config.pop("rms_norm_eps")
        words = "no 'rms_norm_eps'"
    with pytest.raises(ModelFlagsError, match=words):
        megatron_model_flags(config)


def test_bad_files_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelFlagsError, match="does not exist"):
        megatron_model_flags(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{not json")
    assert main([str(tmp_path)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_cli_prints_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("--num-layers 28 --hidden-size 1024")


@pytest.mark.parametrize(
    ("vocab", "tp", "divisor", "padded"),
    [
        (151936, 1, 128, 151936),  # Qwen3: 2^7 x 1187, Megatron's default adds nothing
        (151936, 8, 16, 151936),  # at TP 8 the default (128 x 8) would add 640 rows
        (704, 1, 64, 704),  # the embedded default's vocabulary (the default adds 64)
        (248320, 2, 128, 248320),  # Qwen3.5
        (1001, 1, 1, 1001),  # odd: no power of two divides it, and none is needed
        (1001, 2, 1, 1002),  # TP 2 cannot split 1001 rows: one padding row, the least
    ],
)
def test_the_vocab_divisor_leaves_no_padding_where_it_can(
    vocab: int, tp: int, divisor: int, padded: int
) -> None:
    """Megatron pads the vocabulary to a multiple of ``divisor x TP`` (its
    ``_vocab_size_with_padding``); the padding rows enter slime's log-softmax as tokens."""
    flags = megatron_model_flags({**QWEN3_06B, "vocab_size": vocab}, tensor_parallel=tp)
    assert int(_value(flags, "--make-vocab-size-divisible-by")) == divisor
    multiple = divisor * tp
    assert -(-vocab // multiple) * multiple == padded


def test_the_command_line_takes_the_tensor_parallel_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    assert main([str(tmp_path), "--tensor-model-parallel-size", "8"]) == 0
    flags = capsys.readouterr().out.split()
    assert _value(flags, "--make-vocab-size-divisible-by") == "16"
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--tensor-model-parallel-size", "0"])
