"""A memo in front of TITO's encoder for text that agents send again and again.

Every session of a rollout starts with the same system prompt and tool schemas, so TITO's
``start`` encodes the same few thousand characters for each one (about 1.5 ms on the Qwen3.5
vocabulary). A fast tokenizer splits its input on added tokens (``<|im_start|>``, ``<think>``,
...) before anything else and encodes the text between them independently, so
``encode(text)`` is the concatenation of the added tokens' ids and ``encode(piece)`` of each piece
between them. :class:`PieceMemoEncoder` keeps the ids of long pieces it has seen twice (a tool
result seen once is not worth keeping; the memo is bounded, least recently used out first) and
returns exactly what the encoder would. It is installed only when that split
is exact for the tokenizer: every added token matched on the raw text, with no stripping of the
whitespace around it (``lstrip``/``rstrip``/``single_word`` off, ``normalized`` off).

    install_encode_memo(tito)      # create_app does this

The memo is shared by the event loop and the worker threads that tokenize large inputs
(:mod:`~dressage.proxy.sessions`), so its bookkeeping is under a lock; encoding is not.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dressage.proxy.tito import TITOTokenizer

__all__ = ["PieceMemoEncoder", "exact_added_tokens", "install_encode_memo"]

Encoder = Callable[[str], list[int]]


def exact_added_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[str, int] | None:
    """The added tokens (text -> id) when splitting on them is exact, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    added: list[dict[str, Any]] = json.loads(backend.to_str()).get("added_tokens") or []
    if not added:
        return None
    for token in added:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            return None
        if token.get("normalized"):
            return None
    return {str(t["content"]): int(t["id"]) for t in added}


class PieceMemoEncoder:
    """``encode`` with the ids of long pieces between added tokens remembered."""

    def __init__(
        self,
        encode: Encoder,
        added: dict[str, int],
        *,
        min_chars: int = 512,
        max_chars: int = 1_000_000,
        max_seen: int = 65_536,
    ) -> None:
        self._encode = encode
        self._added = added
        alternatives = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
        self._split = re.compile(f"({alternatives})").split
        self._memo: OrderedDict[str, list[int]] = OrderedDict()
        self._seen: OrderedDict[int, None] = OrderedDict()
        """Hashes of pieces seen once (admission on the second sight)."""
        self._chars = 0
        self._lock = threading.Lock()
        self.min_chars = min_chars
        self.max_chars = max_chars
        self.max_seen = max_seen
        self.hits = 0

    @classmethod
    def wrap(cls, encode: Encoder, tokenizer: PreTrainedTokenizerBase) -> PieceMemoEncoder | None:
        added = exact_added_tokens(tokenizer)
        return None if added is None else cls(encode, added)

    def _piece(self, piece: str) -> list[int]:
        with self._lock:
            ids = self._memo.get(piece)
            if ids is not None:
                self._memo.move_to_end(piece)
                self.hits += 1
                return ids
        ids = self._encode(piece)
        with self._lock:
            return self._remember(piece, ids)

    def _remember(self, piece: str, ids: list[int]) -> list[int]:
        if piece in self._memo:  # another thread encoded it meanwhile
            return ids
        key = hash(piece)
        if key not in self._seen:
            self._seen[key] = None
            if len(self._seen) > self.max_seen:
                self._seen.popitem(last=False)
            return ids
        del self._seen[key]
        self._memo[piece] = ids
        self._chars += len(piece)
        while self._chars > self.max_chars:
            old, _ = self._memo.popitem(last=False)
            self._chars -= len(old)
        return ids

    def __call__(self, text: str) -> list[int]:
        if len(text) < self.min_chars:
            return self._encode(text)
        out: list[int] = []
        for i, part in enumerate(self._split(text)):
            if i % 2:
                out.append(self._added[part])
            elif len(part) >= self.min_chars:
                out += self._piece(part)
            elif part:
                out += self._encode(part)
        return out


def install_encode_memo(tito: TITOTokenizer) -> bool:
    """Put a :class:`PieceMemoEncoder` in front of ``tito``'s encoder (and of the tokenizer it
    wraps, in snapshot mode); False when the tokenizer's split is not exact."""
    installed = False
    for target in (tito, getattr(tito, "inner", None)):
        if target is None or isinstance(target.encode, PieceMemoEncoder):
            continue
        memo = PieceMemoEncoder.wrap(target.encode, target.tokenizer)
        if memo is not None:
            target.encode = memo
            installed = True
    return installed
