"""What a cumulative stream chunk repeats of the chunk before it, cut before it is parsed.

SGLang streams cumulatively by default (docs/sglang.md section 1): each chunk carries the whole
text so far, every output id so far and every ``output_token_logprobs`` triple so far. Parsing
each chunk whole costs the proxy time in proportion to the answer's length so far, so a streamed
answer of n tokens costs O(n^2): 5 µs a chunk at 50 tokens, 300 µs at 2,000 (orjson, measured on
the 2-core machine). :class:`CumulativeCut` keeps the bytes of each repeated value as the
previous chunk sent it and, where the new chunk's value starts with exactly those bytes, keeps
only what follows:

    cut = CumulativeCut()
    for payload in chunks:
        text, was_cut = cut(payload)     # was_cut: the per-token lists hold only new items
        data = loads_engine(text)

A cut chunk reads like an incremental one (``--incremental-streaming-output``): its
``output_token_logprobs`` (and ``output_top_logprobs``, when asked) hold the new tokens alone,
while ``completion_tokens`` stays cumulative. The cut is byte for byte: an item is dropped only
where the previous chunk's value, every byte of it, begins the new one and a separator follows,
so the parsed new items are exactly what a whole parse would have given past the old ones. What
the cut cannot prove, it leaves: a value that changed, a key that moved or went missing, a
chunk with no ``completion_tokens`` to check against. The caller checks that the cumulative count
equals the items it had plus those it got, and parses the chunk whole when it does not
(:func:`dressage.proxy.engine_answers.read_stream`).

``text`` and ``output_ids`` (read by nothing here) are cut the same way, for the parse's sake
only; the per-token lists are cut together or not at all, so that a chunk's top log-probs always
line up with its tokens.
"""

from __future__ import annotations

import re

__all__ = ["CumulativeCut"]

PER_TOKEN = (b"output_token_logprobs", b"output_top_logprobs")
"""The per-token lists the proxy reads: cut together, or neither."""
REPEATED = (b"text", b"output_ids")
"""Repeated values nothing reads: cut where the bytes allow, left whole otherwise."""
KEYS = (b"text", b"output_ids", b"output_token_logprobs", b"output_top_logprobs")
"""In the order SGLang writes them, so that each key is looked for after the one before."""

CUT_FROM_BYTES = 8192
"""Smaller chunks are parsed whole: about 200 tokens, where cutting and parsing whole cost the
same (15 µs a chunk on the 2-core machine). The first larger chunk of a stream is read whole
and its values' ends found, for the next one to be cut."""

_STRUCTURE = re.compile(rb'["\[\]{}]')
_FLAT_REST = re.compile(rb'(?:[^"\[\]{}]++|\[[^"\[\]{}]*+\])*+\]')
"""The rest of a list, up to and with its closer, when it holds no string and no deeper
nesting than flat lists (ids; ``[logprob, id, null]`` triples): one match in C, where
:func:`_closer` takes a Python step per bracket. Each part it takes keeps the depth as it was
(a byte that is not a bracket, brace or quote, or a whole flat list), so the closer it ends
at is the list's own."""
_SPACE = b" \t\r\n"


def _value_start(payload: bytes, key: bytes, lo: int, hi: int) -> int:
    """Where the value of ``"key":`` starts (its ``[`` or ``"``), for a key between ``lo`` and
    ``hi``; -1 if there is none or its value is neither."""
    quoted = b'"' + key + b'"'
    at = payload.find(quoted, lo, hi)
    while at >= 0:
        # A quote inside a JSON string is escaped, so '"key"' followed by a colon is a key.
        at += len(quoted)
        while at < len(payload) and payload[at] in _SPACE:
            at += 1
        if at < len(payload) and payload[at] == 0x3A:  # ':'
            at += 1
            while at < len(payload) and payload[at] in _SPACE:
                at += 1
            if at < len(payload) and payload[at] in b'["':
                return at
            return -1
        at = payload.find(quoted, at, hi)
    return -1


def _find_value(payload: bytes, key: bytes, frm: int, spans: list[tuple[int, int]]) -> int:
    """The value of ``key``: looked for after ``frm`` (where SGLang's order puts it), then
    before, outside the ``spans`` of the values found already (a string or a list of numbers
    holds no key, and they are most of a chunk's bytes)."""
    at = _value_start(payload, key, frm, len(payload))
    if at >= 0:
        return at
    lo = 0
    for start, end in sorted(spans):
        if start >= frm:
            break
        at = _value_start(payload, key, lo, start)
        if at >= 0:
            return at
        lo = end
    return _value_start(payload, key, lo, frm)


def _closer(payload: bytes, at: int, depth: int) -> int:
    """The index of the bracket that closes a value, scanning from ``at`` inside it at
    ``depth`` (1: directly inside the outer array); -1 if the payload ends first."""
    if depth == 1:
        flat = _FLAT_REST.match(payload, at)
        if flat is not None:
            return flat.end() - 1
    while True:
        match = _STRUCTURE.search(payload, at)
        if match is None:
            return -1
        at = match.end()
        char = payload[match.start()]
        if char == 0x22:  # '"': skip the string
            end = _string_end(payload, at)
            if end < 0:
                return -1
            at = end + 1
        elif char in b"[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return match.start()


def _string_end(payload: bytes, at: int) -> int:
    """The index of the quote that ends a string whose content resumes at ``at`` (where a whole
    character or escape ended): the first quote after an even run of backslashes, found a
    quote at a time in C."""
    start = at
    while True:
        quote = payload.find(b'"', at)
        if quote < 0:
            return -1
        back = quote
        while back > start and payload[back - 1] == 0x5C:  # '\\'
            back -= 1
        if (quote - back) % 2 == 0:
            return quote
        at = quote + 1


class CumulativeCut:
    """Cuts one stream's chunks, in order (one instance per stream)."""

    def __init__(self) -> None:
        self._sent: dict[bytes, bytes] = {}
        """Per key, the previous chunk's value from its opener up to (not with) its closer."""
        self._off = False
        """Set once a per-token list did not go on from its previous value: finding where such
        a list ends from its opener is a Python step per item, so a stream that changes what
        it sent is parsed whole from then on, as it was before the cut existed."""

    def state(self) -> tuple[dict[bytes, bytes], bool]:
        """What the cut knows, for :meth:`restore` after a chunk that turned out not to be the
        next one read (``__call__`` replaces what it keeps, it never changes it in place)."""
        return self._sent, self._off

    def restore(self, state: tuple[dict[bytes, bytes], bool]) -> None:
        self._sent, self._off = state

    def __call__(self, payload: bytes) -> tuple[bytes, bool]:
        """``payload`` with what the previous chunk already sent cut from each repeated value,
        and whether the per-token lists were cut."""
        if self._off or len(payload) < CUT_FROM_BYTES:
            if self._sent:
                self._sent = {}
            return payload, False
        cuts: dict[bytes, tuple[int, int]] = {}  # key -> (value start, where the new part starts)
        seen: dict[bytes, bytes] = {}
        frm = 0
        spans: list[tuple[int, int]] = []
        for key in KEYS:
            start = _find_value(payload, key, frm, spans)
            if start < 0:
                continue
            sent = self._sent.get(key)
            skip = _resume(payload, start, sent)
            if skip < 0 and sent is not None and key in PER_TOKEN:
                self._off, self._sent = True, {}
                return payload, False
            if skip < 0:  # nothing to cut: find the value's end from its opener
                end = _end(payload, start, start + 1)
            else:
                end = _end(payload, start, skip)
            if end < 0:
                continue
            seen[key] = payload[start:end]
            spans.append((start, end))
            frm = end
            if skip >= 0:
                cuts[key] = (start, skip)
        self._sent = seen
        present = [k for k in PER_TOKEN if k in seen]
        per_token = bool(present) and all(k in cuts for k in present)
        keep = [k for k in KEYS if k in cuts and (per_token or k in REPEATED)]
        if not keep:
            return payload, False
        pieces: list[bytes] = []
        at = 0
        for start, skip in sorted(cuts[k] for k in keep):
            pieces.append(payload[at : start + 1])  # up to and with the opener
            at = skip
            if payload[start] == 0x5B:  # '[': after the old items, spaces and one comma
                while payload[at] in _SPACE:
                    at += 1
                if payload[at] == 0x2C:
                    at += 1
        pieces.append(payload[at:])
        return b"".join(pieces), per_token


def _resume(payload: bytes, start: int, sent: bytes | None) -> int:
    """Where the new part of a value starts, when the value begins with ``sent`` (the previous
    chunk's) and what follows can only extend it; -1 otherwise."""
    if sent is None or not payload.startswith(sent, start):
        return -1
    at = start + len(sent)
    if sent[:1] == b'"':
        return at  # a string's text goes on (its end was a whole character or escape)
    if len(sent) == 1:
        return at  # the previous array was empty: every item is new
    follow = at
    while follow < len(payload) and payload[follow] in _SPACE:
        follow += 1
    # after the old items, a separator or the closer: not the rest of a longer last item
    if follow < len(payload) and payload[follow] in b",]":
        return at
    return -1


def _end(payload: bytes, start: int, at: int) -> int:
    """The index of the closer of the value that starts at ``start``, scanning from ``at``."""
    if payload[start] == 0x22:
        return _string_end(payload, at)
    return _closer(payload, at, 1)
