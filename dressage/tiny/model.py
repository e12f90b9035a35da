"""Tiny Qwen3-architecture causal LMs, made deterministically from a seed.

They carry a real Qwen vocabulary (so real tokenizers and chat formats apply) and a few tens of
thousands of non-embedding parameters, small enough for CPU tests and the embedded default::

    from dressage.tiny import tiny_model_dir
    path = tiny_model_dir()                        # student, seed 0
    teacher = tiny_model_dir(TinyModelSpec(seed=1))
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from dressage.assets._cache import cached_build, cached_path, recipe_key
from dressage.assets.tokenizers import (
    QWEN_VOCABS,
    QwenVocab,
    qwen_tokenizer_dir,
    qwen_tokenizer_key,
)
from dressage.config.env import env_str
from dressage.tiny.task_tokenizer import TASK_VOCAB, task_tokenizer_dir, task_tokenizer_key

_RECIPE_VERSION = 1


ModelVocab = QwenVocab | Literal["qwen3.5-tasks"]


@dataclass(frozen=True)
class TinyModelSpec:
    """``vocab``: a real Qwen vocabulary, or ``qwen3.5-tasks``, the small Qwen3.5-format one of
    :mod:`dressage.tiny.task_tokenizer` (the embedded default's, for speed)."""

    vocab: ModelVocab = "qwen3.5"
    seed: int = 0
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 32768
    pretrained: str = ""
    """A named pre-trained base (:data:`dressage.tiny.generalist.BASES`: ``generalist`` ships,
    ``generalist-large`` is pre-trained on first use) instead of a seeded random init; the other
    fields must then describe it (:func:`generalist_spec`)."""


def generalist_spec(name: str = "generalist") -> TinyModelSpec:
    """The spec of a named pre-trained base (``base=NAME`` in a ``tiny-sft:`` spec; the shipped
    ``generalist`` by default; :data:`dressage.tiny.generalist.BASES`)."""
    from dressage.tiny.generalist import base_recipe

    return base_recipe(name).model_spec(pretrained=name)


def build_device() -> str:
    """Where the project's own models train when they are built: ``DRESSAGE_BUILD_DEVICE``, else
    cuda when torch sees one, else cpu."""
    configured = env_str("DRESSAGE_BUILD_DEVICE")
    if configured:
        return configured
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_base_spec(spec: TinyModelSpec) -> None:
    expected = generalist_spec(spec.pretrained)
    wrong = [
        f"{name}={value!r} (the base has {getattr(expected, name)!r})"
        for name, value in asdict(spec).items()
        if value != getattr(expected, name)
    ]
    if wrong:
        raise ValueError(f"pretrained={spec.pretrained}: {', '.join(wrong)}; leave those keys out")


def _pretrained_dir(spec: TinyModelSpec) -> Path:
    from dressage.tiny.generalist import base_dir

    _check_base_spec(spec)
    return base_dir(spec.pretrained)


def model_key(spec: TinyModelSpec) -> str:
    """What names a tiny model's weights in a cache key, without building it: a random init's
    cache folder name; the shipped base's name and the hash of its weights (a rebuilt base keys
    new teachers); a base pre-trained on first use, its name and its recipe's key."""
    if not spec.pretrained:
        return tiny_model_key(spec)
    from dressage.tiny.generalist import SHIPPED_BASES, base_build_key

    _check_base_spec(spec)
    if spec.pretrained not in SHIPPED_BASES:
        return f"{spec.pretrained}-{base_build_key(spec.pretrained)}"
    folder = _pretrained_dir(spec)  # shipped in the package: found, never built
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]
    return f"{spec.pretrained}-{digest}"


def tiny_model_key(spec: TinyModelSpec | None = None) -> str:
    """The name of :func:`tiny_model_dir`'s folder for ``spec``, computed without building or
    writing anything (the tokenizer's folder name too is computed, not built).

    Raises:
        ValueError: ``pretrained`` names no known base, or the spec does not describe it.
    """
    spec = spec or TinyModelSpec()
    if not spec.pretrained:
        return recipe_key(_recipe(spec))
    from dressage.tiny.generalist import SHIPPED, SHIPPED_BASES, base_build_key

    _check_base_spec(spec)
    return SHIPPED.name if spec.pretrained in SHIPPED_BASES else base_build_key(spec.pretrained)


def cached_tiny_model_dir(spec: TinyModelSpec | None = None) -> Path | None:
    """The folder of ``spec``'s model when it is built (a shipped base always is), else None:
    builds, trains and writes nothing.

    Raises:
        ValueError: ``pretrained`` names no known base, or the spec does not describe it.
    """
    spec = spec or TinyModelSpec()
    if not spec.pretrained:
        return cached_path("models", _recipe(spec))
    from dressage.tiny.generalist import cached_base_dir

    _check_base_spec(spec)
    return cached_base_dir(spec.pretrained)


def vocab_dir(vocab: str) -> Path:
    """The tokenizer folder of a :class:`TinyModelSpec` vocabulary name (built on first use)."""
    if vocab == TASK_VOCAB:
        return task_tokenizer_dir()
    if vocab in QWEN_VOCABS:
        return qwen_tokenizer_dir(vocab)
    raise ValueError(f"unknown vocabulary {vocab!r}; expected one of {[*QWEN_VOCABS, TASK_VOCAB]}")


def vocab_key(vocab: str) -> str:
    """The name of :func:`vocab_dir`'s folder, computed without building the tokenizer."""
    if vocab == TASK_VOCAB:
        return task_tokenizer_key()
    if vocab in QWEN_VOCABS:
        return qwen_tokenizer_key(vocab)
    raise ValueError(f"unknown vocabulary {vocab!r}; expected one of {[*QWEN_VOCABS, TASK_VOCAB]}")


def init_tiny_model(spec: TinyModelSpec) -> Any:
    """A fresh Qwen3 causal LM per ``spec`` (architecture, vocabulary, seed), not saved; the
    global torch generator is left as it was."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(vocab_dir(spec.vocab)))
    vocab = tokenizer.get_vocab()
    config = Qwen3Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=vocab["<|im_end|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        return Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)


def copy_tokenizer(tok_dir: Path, out: Path) -> None:
    """The tokenizer files of a tokenizer cache folder, copied beside a model in ``out``."""
    import shutil

    for item in tok_dir.iterdir():
        if item.is_file() and item.name not in {"recipe.json", ".complete"}:
            shutil.copy2(item, out / item.name)


def _build(spec: TinyModelSpec, out: Path) -> None:
    init_tiny_model(spec).save_pretrained(str(out), safe_serialization=True)
    copy_tokenizer(vocab_dir(spec.vocab), out)


def tiny_model_dir(spec: TinyModelSpec | None = None) -> Path:
    """Folder of a tiny model plus its tokenizer, in Hugging Face layout.

    Raises:
        ValueError: ``pretrained`` names no known base, or the spec does not describe it.
    """
    spec = spec or TinyModelSpec()
    if spec.pretrained:
        return _pretrained_dir(spec)
    return cached_build("models", _recipe(spec), lambda out: _build(spec, out))


def _recipe(spec: TinyModelSpec) -> dict[str, Any]:
    """A random init's cache recipe (computing it builds nothing)."""
    # the tokenizer folder's key: a rebuilt tokenizer (new template, say) gives a new model folder
    recipe = {"kind": "tiny-qwen3", "version": _RECIPE_VERSION, "tokenizer": vocab_key(spec.vocab)}
    recipe.update(asdict(spec))
    return recipe
