"""Megatron's model flags for a Hugging Face checkpoint of a dense Qwen3/Qwen2/Llama model.

slime builds the actor from Megatron's flags (``--num-layers``, ``--hidden-size``, ...), and checks
them against the checkpoint's ``config.json`` (``_hf_validate_args``); its own examples keep one
shell file of them per model. :func:`megatron_model_flags` derives them from the ``config.json``
itself, so the flags and the checkpoint cannot disagree::

    python -m dressage.slime.model_flags PATH/TO/HF_CHECKPOINT     # prints the flags

Only dense decoder models of these families are known; anything else (a mixture of experts,
sliding-window attention, a rope scaling) is refused with a sentence naming the field, so that a
wrong model is never built quietly.

The flags also choose ``--make-vocab-size-divisible-by`` (:func:`vocab_divisor`). Megatron pads
the vocabulary to a multiple of that number times the tensor-parallel size, and the padding rows
are real output rows: slime's log-softmax counts each as a token (a zero row adds one unit of
probability mass at every position). With Megatron's default of 128, the embedded default's
704-token vocabulary gets 64 such rows, which moved a teacher's log-probs by up to 0.012 nats
against the same model in Hugging Face. The divisor chosen leaves no padding where the
vocabulary allows it.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelFlagsError", "megatron_model_flags", "vocab_divisor"]

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


MEGATRON_VOCAB_DIVISOR = 128
"""Megatron's default ``--make-vocab-size-divisible-by``."""


def vocab_divisor(vocab_size: int, tensor_parallel: int = 1) -> int:
    """The largest power of two up to Megatron's default 128 whose product with
    ``tensor_parallel`` divides ``vocab_size``: Megatron then adds no padding rows. When none
    does (a vocabulary that the tensor-parallel size does not divide), 1: the least padding."""
    divisor = MEGATRON_VOCAB_DIVISOR
    while divisor > 1 and vocab_size % (divisor * tensor_parallel):
        divisor //= 2
    return divisor


def megatron_model_flags(
    source: str | Path | Mapping[str, Any], *, tensor_parallel: int = 1
) -> list[str]:
    """Megatron's flags for the model of ``source`` (a checkpoint folder, its ``config.json``, or
    that file's content), in the form slime's examples write them, for ``tensor_parallel``-way
    tensor parallelism (it decides ``--make-vocab-size-divisible-by``).

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
            "--make-vocab-size-divisible-by",
            str(vocab_divisor(int(config["vocab_size"]), tensor_parallel)),
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
    from dressage.commands import command_parser

    parser = command_parser(
        "python -m dressage.slime.model_flags",
        description="Print Megatron's model flags for a Hugging Face checkpoint of a dense "
        "Qwen3/Qwen2/Llama model.",
    )
    parser.add_argument("checkpoint", metavar="HF_CHECKPOINT", help="the checkpoint folder")
    parser.add_argument(
        "--tensor-model-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="the run's tensor-parallel size: it decides --make-vocab-size-divisible-by",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.tensor_model_parallel_size < 1:
        parser.error(
            f"--tensor-model-parallel-size must be >= 1, got {args.tensor_model_parallel_size}"
        )
    try:
        flags = megatron_model_flags(
            args.checkpoint, tensor_parallel=args.tensor_model_parallel_size
        )
    except ModelFlagsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(shlex.join(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
