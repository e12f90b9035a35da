"""Megatron's model flags for a Hugging Face checkpoint of a dense Qwen3/Qwen2/Llama model.

slime builds the actor from Megatron's flags (``--num-layers``, ``--hidden-size``, ...), and checks
them against the checkpoint's ``config.json`` (``_hf_validate_args``); its own examples keep one
shell file of them per model. :func:`megatron_model_flags` derives them from the ``config.json``
itself, so the flags and the checkpoint cannot disagree::

    python -m dressage.slime.model_flags PATH/TO/HF_CHECKPOINT     # prints the flags

Only dense decoder models of these families are known; anything else (a mixture of experts,
sliding-window attention, a rope scaling) is refused with a sentence naming the field, so that a
wrong model is never built quietly.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelFlagsError", "megatron_model_flags"]

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")
_QK_NORM = {"qwen3": True, "qwen2": False, "llama": False}


class ModelFlagsError(ValueError):
    """The checkpoint is not a model these flags can describe; the message names the field."""


def _config(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    file = path / "config.json" if path.is_dir() else path
    try:
        return dict(json.loads(file.read_text()))
    except FileNotFoundError:
        raise ModelFlagsError(f"{file} does not exist: pass a Hugging Face checkpoint") from None
    except json.JSONDecodeError as exc:
        raise ModelFlagsError(f"{file} is not valid JSON ({exc.msg}, line {exc.lineno})") from None


def _rope_theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for block in (params, scaling):
        kind = block.get("rope_type") or block.get("type")
        if kind not in (None, "default"):
            raise ModelFlagsError(f"rope_type {kind!r} is not supported (only plain rope)")
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is None:
        raise ModelFlagsError("config.json names no rope_theta")
    return float(theta)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def megatron_model_flags(source: str | Path | Mapping[str, Any]) -> list[str]:
    """Megatron's flags for the model of ``source`` (a checkpoint folder, its ``config.json``, or
    that file's content), in the form slime's examples write them.

    Raises:
        ModelFlagsError: the model is not a dense Qwen3/Qwen2/Llama decoder, or a field these
            flags need is missing.
    """
    config = _config(source)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        known = ", ".join(SUPPORTED_MODEL_TYPES)
        raise ModelFlagsError(f"model_type {model_type!r} is not supported (known: {known})")
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(field):
            raise ModelFlagsError(f"{field}={config[field]}: mixtures of experts are not supported")
    if config.get("use_sliding_window") and config.get("sliding_window"):
        raise ModelFlagsError("use_sliding_window is on: sliding-window attention is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise ModelFlagsError(f"hidden_act {config['hidden_act']!r} is not supported (only silu)")
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        flags = [
            "--num-layers", str(int(config["num_hidden_layers"])),
            "--hidden-size", str(hidden),
            "--ffn-hidden-size", str(int(config["intermediate_size"])),
            "--num-attention-heads", str(heads),
            "--group-query-attention",
            "--num-query-groups", str(int(config.get("num_key_value_heads") or heads)),
            "--kv-channels", str(int(config.get("head_dim") or hidden // heads)),
            "--vocab-size", str(int(config["vocab_size"])),
            "--norm-epsilon", _number(float(config["rms_norm_eps"])),
        ]  # fmt: skip
    except KeyError as exc:
        raise ModelFlagsError(f"config.json has no {exc.args[0]!r}") from None
    flags += ["--normalization", "RMSNorm", "--swiglu", "--use-rotary-position-embeddings"]
    flags += ["--rotary-base", _number(_rope_theta(config))]
    if _QK_NORM[model_type]:
        flags += ["--qk-layernorm"]
    if model_type == "qwen2" or config.get("attention_bias"):
        flags += ["--add-qkv-bias"]
    flags += ["--disable-bias-linear"]
    if not config.get("tie_word_embeddings", False):
        flags += ["--untie-embeddings-and-output-weights"]
    return flags


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m dressage.slime.model_flags HF_CHECKPOINT", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    try:
        print(shlex.join(megatron_model_flags(args[0])))
    except ModelFlagsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
