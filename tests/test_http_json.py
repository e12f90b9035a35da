"""dressage.http_json: bodies too deep or holding lone surrogates are refused, naming where."""

from __future__ import annotations

import pytest

from dressage.http_json import MAX_DEPTH, JSONBodyError, find_lone_surrogate, parse_json_body

pytestmark = pytest.mark.unit


def _nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_depth_up_to_the_limit_parses_and_one_more_is_refused() -> None:
    assert isinstance(parse_json_body(_nested(MAX_DEPTH))["a"], list)
    with pytest.raises(JSONBodyError, match=f"deeper than {MAX_DEPTH} levels") as info:
        parse_json_body(_nested(MAX_DEPTH + 1))
    assert info.value.param == "a"
    with pytest.raises(JSONBodyError, match="deeper than"):  # the parser's own RecursionError
        parse_json_body(b"[" * 100_000 + b"]" * 100_000)


def test_lone_surrogates_are_refused_and_pairs_are_one_character() -> None:
    assert parse_json_body(b'{"t": "\\ud83d\\ude00"}') == {"t": "\U0001f600"}
    with pytest.raises(JSONBodyError, match=r"m\[1\].c holds a lone UTF-16 surrogate") as info:
        parse_json_body(b'{"m": [{}, {"c": "ab\\udfff"}]}')
    assert info.value.param == "m[1].c"
    with pytest.raises(JSONBodyError, match="a key of"):
        parse_json_body(b'{"\\ud800": 1}')
    assert find_lone_surrogate({"x": ["ok", "\ud800"]}) == "x[1]"
    assert find_lone_surrogate({"x": "fine"}) is None


def test_not_json_names_the_text() -> None:
    with pytest.raises(JSONBodyError, match="the arguments is not valid JSON"):
        parse_json_body(b"{nope", what="the arguments")
    with pytest.raises(JSONBodyError, match="not valid JSON"):
        parse_json_body(b"\xff\xfe")
