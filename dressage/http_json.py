"""JSON request bodies as the proxy and the engine read them: parsed, and checked for what
Python's ``json`` lets through but the rest of the request path cannot carry.

    raw = await read_limited_body(request, limit)   # or BodyTooLarge: 413 for the caller
    value = parse_json_body(raw)          # or JSONBodyError, naming the place: 400 for the caller

``json.loads`` accepts two things that fail much later, as a 500 far from the input:

- nesting deeper than the interpreter's recursion limit (``RecursionError`` in the parser
  itself), and nesting just under it, which fails later in whatever walks the value again
  (the template's ``tojson``, the store's ``json.dumps``). Bodies are capped at
  :data:`MAX_DEPTH` levels;
- a lone UTF-16 surrogate written as an escape (``"\\ud800x"``): a valid JSON string that is not
  Unicode text, so the tokenizer (``TextInputSequence must be str``) and every UTF-8 encoder
  refuse it. A surrogate pair (how ``ensure_ascii`` writes an emoji) is one character and fine.

The depth check walks the containers alone (a long string costs it nothing); the surrogate
check looks at the bytes only when ``json`` read the body, since orjson refuses a lone surrogate.

:func:`loads` and :func:`dumps` are the hot paths' JSON (the proxy's bodies, answers, engine calls
and store lines): orjson where its reading and writing mean what ``json``'s do, ``json`` itself
where they might not. ``loads`` gives ``json.loads``'s value, always: orjson refuses what it does
not read as ``json`` does (``NaN``, a lone surrogate, invalid UTF-8, a BOM, over 1,024 levels)
and ``json`` then reads it, as before; a value holding a float of 2**63 or more in size is read
again by ``json`` (orjson reads an integer literal past 64 bits as such a float). ``json``'s
``NaN`` and infinities come back as :class:`NonFinite` (a ``float``), which orjson will not
write, so ``dumps`` writes such a value through ``json`` too, as ``NaN``/``Infinity`` as before;
the same for non-string keys and integers past 64 bits. Otherwise ``dumps`` is
``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`` in UTF-8, up to how a float is
spelled (``1e-05`` is ``0.00001``: the same number).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "MAX_DEPTH",
    "BodyTooLarge",
    "JSONBodyError",
    "NonFinite",
    "dumps",
    "find_lone_surrogate",
    "loads",
    "loads_engine",
    "loads_record",
    "parse_json_body",
    "read_limited_body",
]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (a tool's JSON schema needs ~10)."""

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_HUGE = 9.2e18
"""Just under 2**63: an integer literal that orjson reads as a float (one past 64 bits) is a
float at least this large; ``json`` reads a float literal this large as the same float."""


def _shape(value: Any, limit: int | None = None) -> tuple[bool, bool]:
    """``(huge, deep)``: whether ``value`` holds a float of :data:`_HUGE` or more in size, and
    whether an array or object lies ``limit`` levels down (never, for None). One walk over the
    containers, level by level; a long string costs it nothing. A deep value's walk stops at
    ``limit`` (it is refused whatever its floats)."""
    if type(value) is float:
        return not -_HUGE < value < _HUGE, False
    level = [value] if type(value) is dict or type(value) is list else []
    huge = False
    depth = 0
    while level:
        if depth == limit:
            return huge, True
        below: list[Any] = []
        for item in level:
            if type(item) is list and _flat_numbers(item):
                continue
            for child in item.values() if type(item) is dict else item:
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
                elif kind is float and not -_HUGE < child < _HUGE:
                    huge = True
        level = below
        depth += 1
    return huge, False


def _flat_numbers(items: list[Any]) -> bool:
    """Whether ``items`` is numbers alone, all of them under :data:`_HUGE` in size: two passes
    in C (a token-id or log-prob list, a few µs), instead of a Python step per item. False for
    anything else (a container, a string, None, a huge or NaN value): the caller walks it."""
    if not items:
        return True
    first = type(items[0])
    if first is not int and first is not float:  # messages, parts, tools: no exception raised
        return False
    try:
        return -_HUGE < min(items) and max(items) < _HUGE
    except TypeError:  # a dict, None or a str beside a number; a list compared with a float
        return False


class NonFinite(float):
    """A ``NaN``, ``Infinity`` or ``-Infinity`` that :func:`loads` read: a float, that
    :func:`dumps` writes back as ``json`` does (orjson would write ``null``)."""


def _non_finite(name: str) -> NonFinite:
    return NonFinite(name)


def _finite_or_not(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else NonFinite(text)  # 1e400: json's inf, kept as such


def _json_loads(raw: bytes) -> Any:
    """``json.loads``, its non-finite numbers (``NaN``, ``1e400``) as :class:`NonFinite`."""
    return json.loads(raw, parse_constant=_non_finite, parse_float=_finite_or_not)


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``'s value, read by orjson when that is the same (module docstring);
    ``ValueError`` (``UnicodeDecodeError``, ``RecursionError`` too) as ``json.loads`` raises."""
    return _loads(raw)[0]


def _loads(raw: bytes, limit: int | None = None) -> tuple[Any, bool, bool]:
    """:func:`loads`, whether ``json`` read it (orjson refused it, or read an integer past
    64 bits as a float), and whether it nests ``limit`` levels deep (:func:`_shape`)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        huge, deep = _shape(value, limit)
        if not huge:
            return value, False, deep
    value = _json_loads(raw)
    return value, True, _shape(value, limit)[1]


_DIGITS = bytes.maketrans(b"012345678", b"999999999")
_LONG_RUN = b"9" * 19
"""19 digits in a row: the shortest integer literal past 2**63 - 1 has 19."""


def loads_record(raw: bytes) -> Any:
    """:func:`loads` for a record line the store wrote: no walk over the value when no run of
    19 digits is in the text (one pass in C, about 1.4 ns a byte), since every integer literal
    is then under 2**63 and orjson reads every number as ``json`` does. A step line holds
    hundreds of token ids and log-probs, whose walk cost more than orjson's parse. A run found
    (a long integer, a string of digits, a float's long mantissa) takes :func:`loads`'s way."""
    if _LONG_RUN in raw.translate(_DIGITS):
        return _loads(raw)[0]
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _json_loads(raw)


def loads_engine(raw: bytes) -> Any:
    """An engine's answer (SGLang's ``/generate``, a stream chunk): :func:`loads` without the
    large-float walk, whose integers (token ids, counts) always fit 64 bits: orjson, ``json``
    for what orjson refuses (a ``NaN`` log-prob). The walk visits every value, and a streamed
    answer's chunks repeat every token so far."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return _json_loads(raw)
    except RecursionError:  # orjson refuses past 1,024 levels, json's recursion runs out
        raise ValueError("the engine's JSON nests arrays and objects too deep to read") from None


def dumps(obj: Any) -> bytes:
    """``json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()`` (module
    docstring): orjson, else ``json`` for what orjson does not write the same."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # NonFinite, a non-str key, an int past 64 bits, a lone surrogate, ...
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class BodyTooLarge(ValueError):
    """The body is over ``limit`` bytes; ``declared`` is its Content-Length when that told."""

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit, self.declared = limit, declared


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The raw body, refused as soon as it is known to exceed ``limit`` bytes: from its
    Content-Length before reading, else while streaming (never buffered past the limit)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)


class JSONBodyError(ValueError):
    """The body is not JSON the service can use; ``param`` is where (``messages[0].content``)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _place(path: tuple[str | int, ...], what: str = "the request body") -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or what


def _walk(
    value: Any, *, depth_limit: bool, surrogates: bool, what: str = "the request body"
) -> None:
    """Depth-first over ``value`` (an explicit stack: the check must not recurse itself)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if surrogates and not _encodable(item):
                raise JSONBodyError(
                    f"{_place(path, what)} holds a lone UTF-16 surrogate "
                    f"(at character {_surrogate_index(item)}): not Unicode text",
                    param=_place(path),
                )
            continue
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        if depth_limit and len(path) >= MAX_DEPTH:
            raise JSONBodyError(
                f"{what} nests arrays and objects deeper than {MAX_DEPTH} levels "
                f"(at {_place(path, what)})",
                param=_place(path[:1]) if path else None,
            )
        for key, child in children:
            if surrogates and isinstance(key, str) and not _encodable(key):
                raise JSONBodyError(
                    f"a key of {_place(path)} holds a lone UTF-16 surrogate: not Unicode text",
                    param=_place(path),
                )
            stack.append((child, (*path, key)))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_index(text: str) -> int:
    return next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)


def find_lone_surrogate(value: Any) -> str | None:
    """Where the first string (or key) holding a lone surrogate is, or None."""
    try:
        _walk(value, depth_limit=False, surrogates=True)
    except JSONBodyError as exc:
        return exc.param
    return None


def parse_json_body(raw: bytes, *, what: str = "the request body") -> Any:
    """``raw`` as a JSON value, or :class:`JSONBodyError` (see the module docstring);
    ``what`` names the text in messages."""
    try:
        value, by_json, deep = _loads(raw, MAX_DEPTH)
    except RecursionError:
        raise JSONBodyError(
            f"{what} nests arrays and objects deeper than {MAX_DEPTH} levels"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JSONBodyError(f"{what} is not valid JSON: {exc}") from None
    # orjson refuses a lone surrogate: only a body that json read may hold one
    surrogates = by_json and _SURROGATE_ESCAPE.search(raw) is not None
    if deep or surrogates:
        _walk(value, depth_limit=deep, surrogates=surrogates, what=what)
    return value
