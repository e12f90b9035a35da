"""The trajectory store's line format, and what can still be read from a damaged line.

One record a line: ``<crc32 of the JSON, 8 hex> <JSON>\\n``. The JSON starts with the record's
*identity* (``t``, ``session_id`` and, for a step, ``step_index`` and ``segment_index``), then
``id_crc`` (crc32 of the identity alone, 8 hex) and ``prev`` (the identity of the line before it
in the log, ``[t, session_id, step_index, segment_index]``, or null), then the rest, and ends
with the identity again (``identity``)::

    1a2b3c4d {"t":"step","session_id":"s1","step_index":3,"segment_index":0,"id_crc":"...",
              "prev":["step","s2",7,1],"prefix_length":40,...,"identity":["step","s1",3,0]}

So a line that fails its checksum can still be told apart: the line after it names it
(:func:`witness`, trustworthy since that line reads back), or the line itself does
(:func:`claimed_identity`): a copy of its identity that ``id_crc`` confirms, or two copies that
agree. One flipped byte cannot change both copies, nor one copy and ``id_crc`` alike; a write
torn short keeps the head. Logs written before these fields existed read the same; their damaged
lines name no session.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from dressage.http_json import dumps, loads_record

__all__ = [
    "FORMAT_FIELDS",
    "Identity",
    "claimed_identity",
    "decode",
    "encode",
    "identity",
    "split_glued",
    "witness",
]

Identity = tuple[str, str, int | None, int | None]
"""``(kind, session_id, step_index, segment_index)``; the indices only for ``step`` records."""

_HEAD = ("t", "session_id", "step_index", "segment_index")
_FIELD = {
    "t": re.compile(rb'"t":"([a-z_]{1,32})"'),
    "session_id": re.compile(rb'"session_id":("(?:[^"\\]|\\.){0,512}")'),
    "step_index": re.compile(rb'"step_index":(\d{1,18})[,}]'),
    "segment_index": re.compile(rb'"segment_index":(\d{1,18})[,}]'),
    "id_crc": re.compile(rb'"id_crc":"([0-9a-f]{8})"'),
}
_TRAILER = re.compile(
    rb',"identity":\[("[a-z_]{1,32}"),("(?:[^"\\]|\\.){0,512}"),'
    rb"(\d{1,18}|null),(\d{1,18}|null)\]\}\s*$"
)
_RECORD_START = re.compile(rb"[0-9a-f]{8} \{")

FORMAT_FIELDS = ("t", "id_crc", "prev", "identity")
"""Fields of a line that are the log's, not the record's (``t``: the record kind)."""


def identity(record: dict[str, Any]) -> Identity:
    kind = str(record.get("t"))
    sid = str(record.get("session_id"))
    if kind != "step":
        return (kind, sid, None, None)
    return (kind, sid, int(record["step_index"]), int(record["segment_index"]))


def _id_crc(ident: Identity) -> str:
    return f"{zlib.crc32(json.dumps(list(ident), separators=(',', ':')).encode()):08x}"


def encode(record: dict[str, Any], prev: Identity | None) -> bytes:
    """The line of ``record`` (its identity first), after a line whose identity is ``prev``."""
    ident = identity(record)
    head = {k: v for k, v in zip(_HEAD, ident, strict=True) if v is not None}
    rest = {k: v for k, v in record.items() if k not in head}
    ordered = {**head, "id_crc": _id_crc(ident), "prev": list(prev) if prev else None, **rest}
    ordered["identity"] = list(ident)
    payload = dumps(ordered)
    return b"%08x " % zlib.crc32(payload) + payload + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """The record of one line (without its newline), or None if its checksum fails. The
    format's own fields (:data:`FORMAT_FIELDS`) are left in the dict."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        record = loads_record(payload)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def witness(record: dict[str, Any]) -> Identity | None:
    """The identity of the line before ``record`` (a record that read back), as it names it."""
    prev = record.get("prev")
    return _identity_of(*prev) if isinstance(prev, list) and len(prev) == 4 else None


def _identity_of(kind: Any, sid: Any, step: Any, segment: Any) -> Identity | None:
    if not isinstance(kind, str) or not isinstance(sid, str):
        return None
    if kind != "step":
        return (kind, sid, None, None)
    if all(type(v) is int and v >= 0 for v in (step, segment)):
        return (kind, sid, step, segment)
    return None


def claimed_identity(line: bytes) -> Identity | None:
    """The identity a damaged line gives of itself, when it can be trusted (see the module
    docstring), else None.

    The line is read as JSON when it still parses, else field by field: the first occurrence of
    a head field is the head's (it comes before any message text), the trailer ends the line.
    """
    head: dict[str, Any] = {}
    trailer: Identity | None = None
    try:
        parsed = json.loads(line[9:])
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        head = parsed
        copy = parsed.get("identity")
        trailer = _identity_of(*copy) if isinstance(copy, list) and len(copy) == 4 else None
    else:
        head = _fields(line)
        found = _TRAILER.search(line)
        if found is not None:
            trailer = _identity_of(*(_json(g) for g in found.groups()))
    first = _identity_of(*(head.get(k) for k in _HEAD))
    crc = head.get("id_crc")
    for candidate in (first, trailer):
        if candidate is not None and crc == _id_crc(candidate):
            return candidate
    return first if first is not None and first == trailer else None


def _fields(line: bytes) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, pattern in _FIELD.items():
        found = pattern.search(line)
        if found is not None:
            text = found.group(1)
            fields[name] = text.decode() if name in ("t", "id_crc") else _json(text)
    return fields


def _json(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:  # UnicodeDecodeError too
        return None


def split_glued(line: bytes) -> int | None:
    """Where the second record starts in a line that is two whole records whose line end was
    damaged (``<record 1><one byte><record 2>``), or None when the line is not that."""
    for found in _RECORD_START.finditer(line, 10):
        at = found.start()
        if decode(line[: at - 1]) is not None and decode(line[at:]) is not None:
            return at
    return None
