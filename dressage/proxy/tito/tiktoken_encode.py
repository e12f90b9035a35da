"""TITO's encoder through ``tiktoken`` for tokenizers whose ids it reproduces.

The Qwen vocabularies are tiktoken BPE files converted for ``tokenizers`` (see
:mod:`dressage.assets.tokenizers`), and ``tiktoken`` encodes the same text 5-10x faster than the
Rust backend of a transformers fast tokenizer. :func:`tiktoken_encoder` returns such an encoder
only when the tokenizer's own description (``backend_tokenizer.to_str()``) is one tiktoken
reproduces step by step:

* added tokens matched on the raw text (``normalized`` off) and with no whitespace stripping
  (``lstrip``/``rstrip``/``single_word`` off): the text is split on them here, longest first at
  the leftmost position, as the backend does; the text between them is encoded alone;
* a normalizer that is NFC or none; NFC is applied by the backend's own normalizer, so the
  Unicode tables are the backend's;
* a pre-tokenizer that is ``Sequence[Split(Regex, isolated), ByteLevel(use_regex=False)]``
  (what :func:`~dressage.assets.tokenizers.byte_level_pre_tokenizer` builds): the regex becomes
  tiktoken's ``pat_str`` and the byte-level alphabet maps back to bytes;
* a byte-level BPE model without dropout, prefixes, suffixes or byte fallback, whose whole pieces
  are looked up first (``ignore_merges``, as tiktoken does), whose ids are its ranks, and whose
  merges are every split of a token into two tokens, in the ranks' order (tiktoken merges the
  pair whose concatenation has the lowest rank; the backend the pair with the lowest merge index);
* no post-processor that adds tokens, no truncation, no padding.

With these, both sides merge the same pair at every step, but for one case the checks do not
exclude: two different splits of one token present at once (say ``x y z`` with ``x+y == y+z``),
where the backend merges the split listed first and tiktoken the leftmost. Strings built around
every such token of the Qwen vocabularies, random text and the repository's own text give the
same ids (``tests/proxy/test_proxy_tiktoken_encode.py``; ``docs/proxy-performance.md``).

The verdict and the :class:`tiktoken.Encoding` are built once per tokenizer (a few seconds for
the 248k Qwen3.5 vocabulary) and cached.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tiktoken
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "TiktokenEncoder",
    "byte_level_alphabet",
    "known_tiktoken_encoder",
    "tiktoken_encoder",
]

Encoder = Callable[[str], list[int]]

_CACHE: weakref.WeakKeyDictionary[Any, TiktokenEncoder | None] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def byte_level_alphabet() -> dict[str, int]:
    """The byte-level pre-tokenizer's characters -> the byte each stands for (GPT-2's table:
    printable Latin-1 bytes are themselves, the others are shifted to code points from 256)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in set(printable))
    for n, b in enumerate(shifted):
        table[chr(256 + n)] = b
    return table


class TiktokenEncoder:
    """``encode(text)``: the added tokens' ids and tiktoken's ids of the text between them."""

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        added: dict[str, int],
        normalize: Callable[[str], str] | None,
        *,
        decodes: bool = False,
    ) -> None:
        self.encoding = encoding
        self.decodes = decodes
        """Whether :meth:`decode` gives the backend's text (see :func:`_decodes_as_bytes`)."""
        self._decode_bytes = encoding.decode_bytes
        self._ordinary = encoding.encode_ordinary
        self._added = added
        self._normalize = normalize
        alternatives = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
        self._split = re.compile(f"({alternatives})").split if added else None

    def _segment(self, text: str) -> list[int]:
        if not text.isascii():
            if self._normalize is not None:
                text = self._normalize(text)  # raises on a lone surrogate, as the backend does
            else:
                text.encode("utf-8")  # the same refusal of a lone surrogate
        return self._ordinary(text)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``: their bytes joined (in Rust), read as UTF-8 with a replacement
        character for each broken sequence, as the backend's ByteLevel decoder reads them.
        Raises ``KeyError`` for an id this encoding does not hold (the backend skips it)."""
        return self._decode_bytes(ids).decode("utf-8", "replace")

    def __call__(self, text: str) -> list[int]:
        if self._split is None:
            return self._segment(text)
        parts = self._split(text)
        if len(parts) == 1:
            return self._segment(text)
        out: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                out.append(self._added[part])
            elif part:
                out += self._segment(part)
        return out


def known_tiktoken_encoder(tokenizer: PreTrainedTokenizerBase) -> tuple[bool, Any]:
    """(True, what :func:`tiktoken_encoder` returns) when it is known for ``tokenizer``
    already; (False, None) when finding out would build it."""
    try:
        return True, _CACHE[tokenizer]
    except (KeyError, TypeError):
        return False, None


def tiktoken_encoder(tokenizer: PreTrainedTokenizerBase) -> TiktokenEncoder | None:
    """A :class:`TiktokenEncoder` giving ``tokenizer``'s ids, or None when its backend is not
    one tiktoken reproduces (checked once per tokenizer)."""
    try:
        return _CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    with _CACHE_LOCK:
        try:
            return _CACHE[tokenizer]
        except KeyError:
            encoder = _build(tokenizer)
            _CACHE[tokenizer] = encoder
            return encoder
        except TypeError:  # not weakly referenceable: no cache
            return _build(tokenizer)


def _build(tokenizer: PreTrainedTokenizerBase) -> TiktokenEncoder | None:
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer) or backend.encode_special_tokens:
        return None
    spec: dict[str, Any] = json.loads(backend.to_str())
    pattern = split_pattern(spec)
    added = plain_added_tokens(spec)
    ranks = bpe_ranks(spec)
    if pattern is None or added is None or ranks is None or not _plain_pipeline(spec):
        return None
    return TiktokenEncoder(
        _encoding(pattern, ranks, added),
        added,
        backend.normalizer.normalize_str if spec.get("normalizer") else None,
        decodes=_decodes_as_bytes(spec, added),
    )


def _decodes_as_bytes(spec: dict[str, Any], added: dict[str, int]) -> bool:
    """Whether the backend's ``decode(ids, skip_special_tokens=False)`` is the ids' bytes as
    tiktoken holds them, joined and read as UTF-8 with replacement: a ``ByteLevel`` decoder and
    nothing else (it maps each token's characters back to bytes, or takes a token with a
    character outside its alphabet as UTF-8, and reads the whole with Rust's
    ``from_utf8_lossy``, which replaces what Python's ``"replace"`` does), and added tokens
    whose bytes that way are their UTF-8, which is what tiktoken holds for them. The model's
    tokens are byte-level text already (:func:`bpe_ranks`)."""
    decoder = spec.get("decoder")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
        return False
    alphabet = byte_level_alphabet()
    for content in added:
        if all(ch in alphabet for ch in content):
            if bytes(alphabet[ch] for ch in content) != content.encode():
                return False
    return True


def _encoding(pattern: str, ranks: dict[bytes, int], added: dict[str, int]) -> tiktoken.Encoding:
    import tiktoken

    return tiktoken.Encoding(
        "dressage-tito",
        pat_str=pattern,
        mergeable_ranks=ranks,
        special_tokens=added,
    )


def _plain_pipeline(spec: dict[str, Any]) -> bool:
    """NFC or no normalizer; nothing added, cut or padded around the encoded text."""
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer != {"type": "NFC"}:
        return False
    if spec.get("truncation") is not None or spec.get("padding") is not None:
        return False
    post = spec.get("post_processor")
    if post is None:
        return True
    if post.get("type") != "TemplateProcessing":
        return False
    return all(set(item) == {"Sequence"} for item in post.get("single") or [])


def split_pattern(spec: dict[str, Any]) -> str | None:
    """The split regex of a ``Sequence[Split(Regex, isolated), ByteLevel(use_regex=False)]``
    pre-tokenizer, else None."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    byte_level_ok = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    if any(byte_level.get(k) != v for k, v in byte_level_ok.items()):
        return None
    pattern = split.get("pattern") or {}
    regex = pattern.get("Regex")
    return regex if isinstance(regex, str) and set(pattern) == {"Regex"} else None


def plain_added_tokens(spec: dict[str, Any]) -> dict[str, int] | None:
    """Added tokens (text -> id) when all are matched on the raw text without stripping."""
    added: dict[str, int] = {}
    for token in spec.get("added_tokens") or []:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            return None
        if token.get("normalized") or not token.get("content"):
            return None
        added[str(token["content"])] = int(token["id"])
    return added


def bpe_ranks(spec: dict[str, Any]) -> dict[bytes, int] | None:
    """The model's tokens as bytes -> id when it is a byte-level BPE that merges as tiktoken
    does (see the module docstring), else None."""
    model = spec.get("model") or {}
    plain = {"type": "BPE", "dropout": None, "byte_fallback": False, "ignore_merges": True}
    if any(model.get(k) != v for k, v in plain.items()):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    vocab: dict[str, int] = model.get("vocab") or {}
    ranks = _byte_ranks(vocab)
    if ranks is None or not _merges_by_rank(vocab, model.get("merges") or []):
        return None
    return ranks


def _byte_ranks(vocab: dict[str, int]) -> dict[bytes, int] | None:
    """Tokens as bytes, when every byte is a token and every token is byte-level text."""
    alphabet = byte_level_alphabet()
    if any(ch not in vocab for ch in alphabet):
        return None
    ranks: dict[bytes, int] = {}
    for token, rank in vocab.items():
        if any(ch not in alphabet for ch in token):
            return None
        ranks[bytes(alphabet[ch] for ch in token)] = rank
    if len(ranks) != len(vocab) or len(set(ranks.values())) != len(ranks):
        return None
    return ranks


def _merges_by_rank(vocab: dict[str, int], merges: list[Any]) -> bool:
    """Merges are exactly every split of a token into two tokens, ordered by the merged token's
    id: then the backend's lowest merge index is tiktoken's lowest rank."""
    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    last = -1
    for left, right in pairs:
        rank = vocab.get(left + right)
        if rank is None or rank < last or left not in vocab or right not in vocab:
            return False
        last = rank
    if len(set(pairs)) != len(pairs):
        return False
    splits = sum(
        1
        for token in vocab
        for k in range(1, len(token))
        if token[:k] in vocab and token[k:] in vocab
    )
    return splits == len(pairs)
