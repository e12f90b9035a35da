"""A cumulative stream chunk is cut to what the chunk before it did not send, before it is parsed
(dressage.proxy.cumulative), and the stream reads exactly as parsing every chunk whole would.

The reference here is the plain reading: each chunk parsed whole, its tokens from the count of
tokens already read on. Streams are generated as SGLang writes them (orjson, no spaces) and as
``json.dumps`` writes them (spaces), cumulative and incremental, with and without top log-probs,
with text that holds escapes, quotes, brackets and non-ASCII characters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dressage.http_json import loads_engine
from dressage.proxy import cumulative
from dressage.proxy.cumulative import CumulativeCut
from dressage.proxy.engine_answers import EngineOutput, _Chunks, read_stream

URL = "http://unused:1"


@pytest.fixture(autouse=True)
def _cut_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks under ``CUT_FROM_BYTES`` are parsed whole; here every chunk takes the cut, so that
    small generated streams test it (one test below keeps the threshold)."""
    monkeypatch.setattr(cumulative, "CUT_FROM_BYTES", 0)


def _dump(value: Any, spaced: bool) -> bytes:
    return json.dumps(value).encode() if spaced else orjson.dumps(value)


def _events(
    tokens: list[tuple[float, int, str]],
    sizes: list[int],
    *,
    tops: bool,
    incremental: bool,
    extra: bool = False,
    texts: bool = False,
    versions: list[int] | None = None,
) -> list[dict[str, Any]]:
    """The chunks of a stream of ``tokens`` (logprob, id, text), ``sizes`` new tokens a chunk;
    ``versions``: each chunk's weight version (3 if not given)."""
    events, at = [], 0
    token_version: list[int] = []
    for k, size in enumerate(sizes):
        new = tokens[at : at + size]
        shown = new if incremental else tokens[: at + size]
        at += size
        version = versions[k] if versions else 3
        token_version += [version] * size
        meta: dict[str, Any] = {
            "id": "r",
            "finish_reason": {"type": "stop", "matched": 1} if k == len(sizes) - 1 else None,
            "prompt_tokens": 7,
            "weight_version": str(version),
            "completion_tokens": at,
            "cached_tokens": 0,
            "output_token_logprobs": [[lp, i, t if texts else None] for lp, i, t in shown],
        }
        if tops:
            meta["output_top_logprobs"] = [
                None if i % 5 == 0 else [[lp, i, t if texts else None], [lp - 1.5, i + 1, None]]
                for lp, i, t in shown
            ]
        if extra:  # keys SGLang adds after the lists, and the keys' names as values
            meta["e2e_latency"] = 0.25
            meta["weight_versions"] = _spans(token_version)
            meta = {"note": "output_top_logprobs", "names": ["output_token_logprobs"], **meta}
        text, ids = "".join(t for *_, t in shown), [i for _, i, _ in shown]
        if extra:  # meta_info first: the keys in another order than SGLang's
            events.append({"meta_info": meta, "output_ids": ids, "text": text})
        else:
            events.append({"text": text, "output_ids": ids, "meta_info": meta})
    return events


def _spans(token_version: list[int]) -> list[dict[str, Any]]:
    """SGLang's ``weight_versions``: a span per run of tokens of one version."""
    spans: list[dict[str, Any]] = []
    for k, version in enumerate(token_version):
        if spans and spans[-1]["version"] == str(version):
            spans[-1]["end"] = k + 1
        else:
            spans.append({"start": k, "end": k + 1, "version": str(version)})
    return spans


async def _batches(payloads: list[bytes], groups: list[int] | None = None) -> AsyncIterator[bytes]:
    """SSE lines as a coalescing reader hands them on: ``groups[k]`` chunks in arrival k (one
    each where not given), ``[DONE]`` after the last."""
    at = 0
    for size in groups or []:
        yield b"".join(b"data: " + payload + b"\n\n" for payload in payloads[at : at + size])
        at += size
    for payload in payloads[at:]:
        yield b"data: " + payload + b"\n\n"
    yield b"data: [DONE]\n"


def _read(payloads: list[bytes], groups: list[int] | None = None) -> list[EngineOutput]:
    async def go() -> list[EngineOutput]:
        return [out async for out in read_stream(_batches(payloads, groups), "r", URL)]

    return asyncio.run(go())


def _reference(payloads: list[bytes]) -> list[tuple[list[int], list[float], list[Any], Any]]:
    """Each chunk parsed whole: its new ids, log-probs, top log-probs and finish."""
    out, received = [], 0
    for payload in payloads:
        meta = loads_engine(payload)["meta_info"]
        triples = meta["output_token_logprobs"]
        start = received if meta["completion_tokens"] == len(triples) else 0
        new = triples[start:]
        tops = [
            [(float(e[0]), int(e[1])) for e in (p or [])]
            for p in (meta.get("output_top_logprobs") or [])[start:]
        ]
        out.append(([t[1] for t in new], [t[0] for t in new], tops, meta["finish_reason"]))
        received += len(new)
        if meta["finish_reason"] is not None:
            break
    return out


def _as_tuples(outputs: list[EngineOutput]) -> list[tuple[list[int], list[float], list[Any], Any]]:
    return [(o.output_ids, o.logprobs, o.top_logprobs, o.finish) for o in outputs]


SPECIAL = list('"\\[]{},:\n\t\u00e9\u4e2d')
TEXT = st.text(st.characters(blacklist_categories=("Cs",)) | st.sampled_from(SPECIAL), max_size=4)
TOKEN = st.tuples(
    st.floats(-30, 0, allow_nan=False) | st.sampled_from([-0.25, 0.0, -1e-05]),
    st.integers(0, 250_000),
    TEXT,
)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(TOKEN, min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 4), max_size=40),
    tops=st.booleans(),
    incremental=st.booleans(),
    spaced=st.booleans(),
    extra=st.booleans(),
    texts=st.booleans(),
    groups=st.lists(st.integers(1, 5), max_size=20),
    updates=st.lists(st.integers(0, 40), max_size=3),
)
def test_a_stream_reads_as_every_chunk_parsed_whole(
    tokens: list[tuple[float, int, str]],
    cuts: list[int],
    tops: bool,
    incremental: bool,
    spaced: bool,
    extra: bool,
    texts: bool,
    groups: list[int],
    updates: list[int],
) -> None:
    """Also with chunks arriving together (``groups``, as a coalescing reader gathers them) and
    weight updates mid-stream (``updates``: the chunks from which the version is one more):
    the same tokens, each with the version of the chunk that first carried it."""
    sizes, left = [], len(tokens)
    for size in cuts:
        if left == 0:
            break
        sizes.append(min(size, left))
        left -= sizes[-1]
    if left:
        sizes.append(left)
    versions = [3 + sum(k >= u for u in updates) for k in range(len(sizes))]
    events = _events(
        tokens,
        sizes,
        tops=tops,
        incremental=incremental,
        extra=extra,
        texts=texts,
        versions=versions,
    )
    payloads = [_dump(e, spaced) for e in events]
    reference = _reference(payloads)
    got = _read(payloads)
    assert _as_tuples(got) == reference
    assert [i for o in got for i in o.output_ids] == [i for _, i, _ in tokens]
    token_versions = [v for v, size in zip(versions, sizes, strict=True) for _ in range(size)]
    assert [v for o in got for v in o.versions] == token_versions

    together = _as_tuples(_read(payloads, groups))
    for k in range(3):  # ids, log-probs, top log-probs: token by token the same
        assert [x for o in together for x in o[k]] == [x for r in reference for x in r[k]]
    assert together[-1][3] == reference[-1][3]
    assert [v for o in _read(payloads, groups) for v in o.versions] == token_versions


@pytest.mark.parametrize("extra", [False, True])
def test_cumulative_chunks_that_arrive_together_are_read_from_the_last(extra: bool) -> None:
    """Chunks 2-5 arrive at once, then 6-9 with a weight update at 8, then 10: the second
    arrival is read from its last chunk alone only where the spans give each token's version
    (``extra``); without them, each chunk is read, so that tokens 6-7 keep version 3. Either
    way an arrival's tokens go on as one output."""
    tokens = [(-0.5, 100 + k, "a") for k in range(10)]
    versions = [3] * 7 + [4] * 3
    events = _events(tokens, [1] * 10, tops=True, incremental=False, extra=extra,
                     versions=versions)  # fmt: skip
    payloads = [orjson.dumps(e) for e in events]
    got = _read(payloads, [1, 4, 4, 1])
    assert [o.output_ids for o in got][:2] == [[100], [101, 102, 103, 104]]
    assert len(got) == 4
    assert [v for o in got for v in o.versions] == versions
    assert [i for o in got for i in o.output_ids] == [100 + k for k in range(10)]


def test_a_cumulative_stream_is_cut_to_its_new_items_from_the_second_chunk_on() -> None:
    tokens = [(-0.5 - k / 100, 1000 + k, f"w{k} ") for k in range(300)]
    events = _events(tokens, [1] * 300, tops=True, incremental=False)
    cut = CumulativeCut()
    for k, event in enumerate(events):
        payload = orjson.dumps(event)
        short, was_cut = cut(payload)
        assert was_cut == (k > 0)
        data = orjson.loads(short)
        if k:
            # only the new token is left of every repeated value
            assert data["text"] == f"w{k} "
            assert data["output_ids"] == [1000 + k]
            assert data["meta_info"]["output_token_logprobs"] == [[tokens[k][0], 1000 + k, None]]
            assert len(data["meta_info"]["output_top_logprobs"]) == 1
            assert len(short) < 400
    assert len(payload) > 15_000  # the last chunk whole


@pytest.mark.parametrize(
    ("first", "second", "cut_ids"),
    [
        # the last id grew (2 -> 23): the previous bytes begin the value but end no item
        ([2], [23, 4], [23, 4]),
        # an earlier id changed: not cut
        ([2, 5], [3, 5, 4], [3, 5, 4]),
        # the same ids again: cut to none
        ([2], [2], []),
        # new ids after the old ones: cut to those
        ([2, 5], [2, 5, 4, 1], [4, 1]),
    ],
)
def test_a_value_is_cut_only_where_the_previous_bytes_end_at_an_item(
    first: list[int], second: list[int], cut_ids: list[int]
) -> None:
    def chunk(ids: list[int], finish: Any) -> bytes:
        meta = {"completion_tokens": len(ids), "finish_reason": finish}
        meta["output_token_logprobs"] = [[-0.5, i, None] for i in ids]
        return orjson.dumps({"text": "", "output_ids": ids, "meta_info": meta})

    payloads = [chunk(first, None), chunk(second, {"type": "stop"})]
    cut = CumulativeCut()
    cut(payloads[0])
    short, _ = cut(payloads[1])
    assert orjson.loads(short)["output_ids"] == cut_ids
    assert _as_tuples(_read(payloads)) == _reference(payloads)


def test_a_chunk_whose_count_disagrees_with_the_cut_is_read_whole() -> None:
    """An incremental stream whose second chunk repeats the first chunk's bytes: the cut would
    drop a real token, and the cumulative count says so."""
    same = [-0.25, 5, None]
    payloads = [
        orjson.dumps({"meta_info": {"completion_tokens": 1, "output_token_logprobs": [same]}}),
        orjson.dumps(
            {
                "meta_info": {
                    "completion_tokens": 3,
                    "finish_reason": {"type": "length"},
                    "output_token_logprobs": [same, [-0.25, 6, None]],
                }
            }
        ),
    ]
    assert [o.output_ids for o in _read(payloads)] == [[5], [5, 6]]


def test_top_logprobs_that_appear_midway_are_not_cut_apart_from_their_tokens() -> None:
    """The per-token lists are cut together: a chunk whose top log-probs have no previous value
    to cut from is read whole, so its tops stay aligned with its tokens."""
    tokens = [(-0.5, 10 + k, "a") for k in range(4)]
    plain = _events(tokens, [1, 1, 1, 1], tops=False, incremental=False)
    with_tops = _events(tokens, [1, 1, 1, 1], tops=True, incremental=False)
    payloads = [orjson.dumps(e) for e in (plain[0], plain[1], with_tops[2], with_tops[3])]
    assert _as_tuples(_read(payloads)) == _reference(payloads)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(TOKEN, min_size=1, max_size=30),
    cuts=st.lists(st.integers(0, 3), max_size=30),
    groups=st.lists(st.integers(1, 6), max_size=12),
    tops=st.booleans(),
    extra=st.booleans(),
    updates=st.lists(st.integers(0, 30), max_size=3),
    counts=st.lists(st.sampled_from([None, 0, 7]), max_size=30),
    shown=st.lists(st.sampled_from(["", "3", "4", "default"]), max_size=30),
)
def test_an_incremental_arrival_read_in_one_pass_is_its_chunks_read_and_joined(
    tokens: list[tuple[float, int, str]],
    cuts: list[int],
    groups: list[int],
    tops: bool,
    extra: bool,
    updates: list[int],
    counts: list[int | None],
    shown: list[str],
) -> None:
    """Several incremental chunks that arrive together are read in one pass; every field of
    the output (tokens, log-probs, tops, versions, finish, the prompt counts, the version
    shown) is what reading each chunk and joining them gives, also where chunks lack prompt
    counts or weight versions."""
    sizes = [c for c in cuts if c] or [len(tokens)]
    while sum(sizes) < len(tokens):
        sizes.append(1)
    at, fitted = 0, []
    for size in sizes:
        if at < len(tokens):
            fitted.append(min(size, len(tokens) - at))
            at += fitted[-1]
    versions = [3 + sum(k >= u for u in updates) for k in range(len(fitted))]
    events = _events(tokens, fitted, tops=tops, incremental=True, extra=extra, versions=versions)
    for k, event in enumerate(events):
        meta = event["meta_info"]
        if counts:
            meta["prompt_tokens"] = counts[k % len(counts)]
            meta["cached_tokens"] = None if meta["prompt_tokens"] is None else k
        if shown:
            meta["weight_version"] = shown[k % len(shown)]
    payloads = [orjson.dumps(e) for e in events]
    fast = [dataclasses.astuple(o) for o in _read(payloads, groups)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Chunks, "_increments", lambda *_: None)  # each chunk read, then joined
        slow = [dataclasses.astuple(o) for o in _read(payloads, groups)]
    assert fast == slow


def test_an_incremental_stream_reads_its_later_arrivals_without_a_step_per_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens = [(-0.5, 100 + k, "a") for k in range(12)]
    payloads = [orjson.dumps(e) for e in _events(tokens, [1] * 12, tops=True, incremental=True)]
    stepped = []
    real = _Chunks._chunk

    def counted(self: _Chunks, payload: bytes) -> EngineOutput:
        stepped.append(payload)
        return real(self, payload)

    monkeypatch.setattr(_Chunks, "_chunk", counted)
    got = _read(payloads, [2, 5, 5])
    assert [o.output_ids for o in got] == [[100, 101], list(range(102, 107)), list(range(107, 112))]
    assert len(stepped) == 2  # the first arrival's two chunks: the rest in one pass each
    assert _as_tuples(got)[-1][3] == {"type": "stop", "matched": 1}


def test_an_arrival_read_in_one_pass_shows_the_last_version_given_and_the_first_prompt_count() -> (
    None
):
    tokens = [(-0.5, 100 + k, "a") for k in range(6)]
    events = _events(tokens, [1] * 6, tops=False, incremental=True)
    shown_and_prompt = zip(["3", "3", "4", "", "", ""], [7, 7, None, 9, 8, 8], strict=True)
    for k, (shown, prompt) in enumerate(shown_and_prompt):
        events[k]["meta_info"].update(weight_version=shown, prompt_tokens=prompt, cached_tokens=k)
    got = _read([orjson.dumps(e) for e in events], [2, 4])
    assert [(o.weight_version, o.prompt_tokens, o.cached_tokens) for o in got] == [
        ("3", 7, 0),
        ("4", 9, 3),
    ]
    assert [v for o in got for v in o.versions] == [3, 3, 4, 0, 0, 0]


def test_a_long_random_stream_with_coalesced_chunks() -> None:
    rng = random.Random(7)
    tokens = [
        (rng.uniform(-20, 0), rng.randrange(250_000), rng.choice(["x", '"', "\\", "]", "é", " "]))
        for _ in range(500)
    ]
    sizes = []
    while sum(sizes) < len(tokens):
        sizes.append(min(rng.choice([1, 1, 1, 2, 3, 7]), len(tokens) - sum(sizes)))
    events = _events(tokens, sizes, tops=True, incremental=False, extra=True, texts=True)
    payloads = [orjson.dumps(e) for e in events]
    assert _as_tuples(_read(payloads)) == _reference(payloads)


def test_chunks_under_the_threshold_are_parsed_whole_and_larger_ones_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cumulative, "CUT_FROM_BYTES", 8192)
    tokens = [(-0.5 - k / 1000, 1000 + k, "word ") for k in range(400)]
    events = _events(tokens, [1] * 400, tops=False, incremental=False)
    payloads = [orjson.dumps(e) for e in events]
    cut = CumulativeCut()
    was = [cut(p)[1] for p in payloads]
    first_large = next(k for k, p in enumerate(payloads) if len(p) >= 8192)
    assert 50 < first_large < 350
    # the first large chunk is read whole (its values' ends are found), the rest are cut
    assert was == [False] * (first_large + 1) + [True] * (len(payloads) - first_large - 1)
    assert _as_tuples(_read(payloads)) == _reference(payloads)


def test_a_stream_that_changes_what_it_sent_is_parsed_whole_from_then_on() -> None:
    """Each chunk's first log-prob differs from the one before: after the first mismatch no
    chunk is cut (finding a list's end anew is a Python step per item), and the stream reads
    as parsing every chunk whole."""
    payloads = []
    for k in range(1, 30):
        triples = [[-0.5 - (0.01 * k if j == 0 else 0), 100 + j, None] for j in range(k)]
        finish = {"type": "stop"} if k == 29 else None
        meta = {"completion_tokens": k, "finish_reason": finish, "output_token_logprobs": triples}
        payloads.append(orjson.dumps({"text": "", "output_ids": [], "meta_info": meta}))
    cut = CumulativeCut()
    assert [cut(p)[1] for p in payloads] == [False] * len(payloads)
    assert cut._off
    assert _as_tuples(_read(payloads)) == _reference(payloads)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"meta_info": {"completion_tokens": 2, "output_token_logprobs": ' + b"[" * 20_000,
        b'{"text": "' + b"x" * 20_000,
        b'{"meta_info": {"output_token_logprobs": [[-0.5, 1, null]' + b" " * 20_000 + b"}}",
    ],
    ids=["unclosed-lists", "unclosed-text", "unclosed-after-items"],
)
def test_a_broken_large_chunk_after_a_good_one_is_an_engine_error(bad: bytes) -> None:
    from dressage.proxy.engine_answers import EngineError

    good = orjson.dumps(
        {"meta_info": {"completion_tokens": 1, "output_token_logprobs": [[-0.5, 1, None]]}}
    )
    with pytest.raises(EngineError, match="bad stream chunk"):
        _read([good, bad])


@pytest.mark.parametrize("incremental", [False, True])
def test_a_failing_chunk_in_an_arrival_fails_the_call_after_the_tokens_before_it(
    incremental: bool,
) -> None:
    """Chunks 2-4 arrive together and chunk 4 is an abort with an error status: tokens 1-3
    reach the reader (as one output for the arrival's good chunks), then the call fails."""
    from dressage.proxy.engine_answers import EngineRejectedError

    tokens = [(-0.5, 100 + k, "a") for k in range(4)]
    events = _events(tokens, [1] * 4, tops=False, incremental=incremental)
    events[-1]["meta_info"]["finish_reason"] = {
        "type": "abort", "message": "bad request", "status_code": 400,
    }  # fmt: skip
    payloads = [orjson.dumps(e) for e in events]
    got: list[EngineOutput] = []

    async def go() -> None:
        async for out in read_stream(_batches(payloads, [1, 3]), "r", URL):
            got.append(out)

    with pytest.raises(EngineRejectedError, match="bad request"):
        asyncio.run(go())
    assert [o.output_ids for o in got] == [[100], [101, 102]]


JSON_ITEM = st.recursive(
    st.none() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(items=st.lists(JSON_ITEM, max_size=8), spaced=st.booleans(), skip=st.integers(0, 8))
@example(items=["]"], spaced=False, skip=0)
@example(items=[1, 'x\\"]', [2]], spaced=True, skip=1)
@example(items=[[-0.5, 3, None], [-0.25, 4, "]"]], spaced=False, skip=1)
@example(items=[{"k": "]"}, [[1]]], spaced=True, skip=0)
@example(items=[["]1]"]], spaced=False, skip=0)
def test_a_list_closer_is_found_with_or_without_strings_and_nesting(
    items: list[Any], spaced: bool, skip: int
) -> None:
    """The closer of a list value, scanned from after its opener or after some of its items
    (where a cut resumes): flat lists of numbers and nulls in one match, anything else (strings
    holding brackets and quotes, objects, deeper lists) bracket by bracket, the same index."""
    value = _dump(items, spaced)
    payload = b'{"a": ' + value + b', "b": [1]}'
    start = payload.index(b"[")
    resume = start + 1
    if 0 < skip <= len(items):  # after the first ``skip`` items, as the previous chunk sent them
        resume = start + len(_dump(items[:skip], spaced)) - 1
    assert cumulative._closer(payload, resume, 1) == start + len(value) - 1
