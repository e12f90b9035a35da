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


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": [1, 2.5, -0.0, 1e-05, 1e16, "x\\n\\u2028\\u00e9"], "b": {"c": null, "d": true}}',
        b'{"big": 123456789012345678901234567890, "neg": -18446744073709551617}',
        b'{"inf": [NaN, Infinity, -Infinity]}',
        b'{"a": 1, "a": 2}',
        b'"\\ud83d\\ude00"',
        b"123456789012345678901234567890",
        b'[0.00012345678901234567, 1.5e-07, "1234567890123456789012", 9223372036854775807]',
        b'[1e19, -9.3e18, {"x": [18446744073709551616, -9223372036854775809]}, 2e18]',
        b'{"ids": [9223372036854775807, 922337203685477580], "lp": [-0.5, -1e-300, -0.0]}',
        b"[1e400, -1e400, 123456789012345678, 1.7976931348623157e308]",
    ],
)
def test_loads_reads_what_json_reads_and_dumps_writes_it_back(raw: bytes) -> None:
    import json
    import math

    from dressage.http_json import dumps, loads, loads_record

    value = loads(raw)
    expected = json.loads(raw)
    for other in (loads_record(raw), loads_record(b" " + raw)):  # orjson alone where it may
        assert json.dumps(other, sort_keys=True) == json.dumps(expected, sort_keys=True)
        assert [type(a) for a in _leaves(other)] == [type(a) for a in _leaves(value)]
    assert json.dumps(value, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert all(type(a) is type(b) or math.isnan(b) or math.isinf(b)
               for a, b in zip(_leaves(value), _leaves(expected), strict=True))  # fmt: skip
    written = dumps(value)
    assert (
        json.loads(written)
        == json.loads(json.dumps(expected, ensure_ascii=False, separators=(",", ":")))
        or "NaN" in written.decode()
    )
    if b"NaN" in raw:  # written back as json writes it, not as orjson's null
        assert written == b'{"inf":[NaN,Infinity,-Infinity]}'


def _leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def test_dumps_falls_back_to_json_for_what_orjson_does_not_write() -> None:
    from dressage.http_json import dumps

    assert dumps({1: [2**70]}) == b'{"1":[1180591620717411303424]}'
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate is no UTF-8, as before
        dumps(["\ud800"])


def test_an_engine_answer_nested_past_what_json_can_read_is_a_value_error() -> None:
    """orjson refuses past 1,024 levels and ``json``'s recursion runs out: one ValueError, which
    the engine client turns into a 502, not a RecursionError out of the call."""
    from dressage.http_json import loads_engine
    from dressage.proxy.engine_answers import error_message

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="too deep"):
        loads_engine(deep)
    assert error_message(deep).startswith("[[[")
