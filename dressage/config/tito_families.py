"""The TITO chat families' names and spellings: vocabulary of the proxy's settings.

The proxy's configuration (:mod:`dressage.config.proxy`) checks a family name before any
tokenizer exists, and :mod:`dressage.proxy.tito.tito_tokenizer` maps each name to its tokenizer
class (and checks at import that it knows exactly these), so the names live here, below both.
"""

from __future__ import annotations

__all__ = ["MODEL_TYPES", "MODEL_TYPE_SPELLINGS", "canonical_model_type"]

MODEL_TYPES: tuple[str, ...] = ("qwen3.5", "qwen3", "llama3", "deepseek", "generic")
"""The canonical family names."""
_CANONICAL: dict[str, str] = {
    spelling: name
    for name in MODEL_TYPES
    for spelling in dict.fromkeys((name, name.replace(".", "_")))
}
MODEL_TYPE_SPELLINGS: tuple[str, ...] = tuple(_CANONICAL)
"""Every accepted spelling: each canonical name, then its underscore form when it has a dot
(``qwen3.5``, ``qwen3_5``, ``qwen3``, ...)."""


def canonical_model_type(model_type: str) -> str:
    """The canonical family name of any accepted spelling (``qwen3_5`` -> ``qwen3.5``).

    Raises:
        ValueError: not a known family; the message lists every accepted spelling.
    """
    try:
        return _CANONICAL[model_type]
    except KeyError:
        raise ValueError(
            f"unknown TITO model_type {model_type!r}; expected one of {list(MODEL_TYPE_SPELLINGS)}"
        ) from None
