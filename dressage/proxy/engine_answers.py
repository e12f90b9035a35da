"""What the engine's ``/generate`` answers hold, read into :class:`EngineOutput`, and the engine
errors (docs/sglang.md sections 1 and 7).

    out = read_output(json.loads(body), "req-1", url)           # a whole answer
    async for out in read_stream(response.batches(), "req-1", url): ...  # SSE chunks: new tokens

An answer's ``meta_info.output_token_logprobs`` are ``[logprob, id, text]`` triples, its
``finish_reason`` is ``{"type": "stop"|"length"|"abort", ...}`` (an abort with an error status is
an error, not a partial output), and its tokens' weight versions are the ``weight_versions`` spans
(SGLang >= 0.5.23) or else the answer's ``weight_version``. Streams are cumulative unless the
server streams increments; both read the same. How the answers are fetched (connections, retries,
the router) is :mod:`~dressage.proxy.engine_client`'s part.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from dressage.http_json import loads_engine
from dressage.proxy.cumulative import CumulativeCut

__all__ = [
    "EngineError",
    "EngineOutput",
    "EngineRejectedError",
    "EngineUnavailableError",
    "error_message",
    "parse_version",
    "read_output",
    "read_stream",
    "token_versions",
]


class EngineError(Exception):
    """The engine did not produce an output; ``status`` is what the agent should get."""

    status = 502

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"engine at {url}: {message}")
        self.url = url
        self.detail = message
        self.partial_generation: Any = None
        """Set by the generation controller when the failure interrupted a call that had
        produced tokens already (a ``Generation``), so that the session can record them."""


class EngineUnavailableError(EngineError):
    """No connection, or no worker behind the router, after every retry."""

    status = 503


class EngineRejectedError(EngineError):
    """The engine answered with an error status (a 4xx is the request's fault)."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(url, f"HTTP {status}: {message}")
        self.engine_status = status
        self.status = status if 400 <= status < 500 else 502


def parse_version(value: Any) -> int:
    """A weight version as an int: integer strings parse, anything else (``"default"``) is 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
    return 0


@dataclass(slots=True)
class EngineOutput:
    """One ``/generate`` answer, or, streaming, the part of it that arrived with one chunk."""

    rid: str
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """Weight version of each output token (from ``weight_versions`` spans, else the answer's
    ``weight_version``; see :func:`parse_version`)."""
    finish: dict[str, Any] | None = None
    """SGLang's ``finish_reason`` object; None while a stream is running."""
    weight_version: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    """Per output token, the engine's most likely tokens ``(logprob, id)`` (asked with
    ``top_logprobs_num``; empty when not asked)."""


def _raw_triples(meta: dict[str, Any], rid: str, url: str) -> list[Any]:
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise EngineError(url, f"request {rid}: meta_info has no output_token_logprobs")
    return triples


def _triples(triples: list[Any], rid: str, url: str) -> tuple[list[int], list[float]]:
    """Ids and log-probs of ``[logprob, id, text]`` triples."""
    try:
        return [int(t[1]) for t in triples], [float(t[0]) for t in triples]
    except (TypeError, ValueError, IndexError) as exc:
        raise EngineError(url, f"request {rid}: malformed output_token_logprobs ({exc})") from None


def token_versions(meta: dict[str, Any], start: int, count: int) -> list[int]:
    """Versions of output tokens ``start .. start+count`` (0.5.23 spans when present)."""
    spans = meta.get("weight_versions")
    default = parse_version(meta.get("weight_version"))
    if not isinstance(spans, list) or not spans:
        return [default] * count
    out = [default] * count
    for span in spans:
        if not isinstance(span, dict):
            continue
        version = parse_version(span.get("version"))
        lo = max(int(span.get("start", 0)), start)
        hi = min(int(span.get("end", 0)), start + count)
        for k in range(lo, hi):
            out[k - start] = version
    return out


def error_message(body: bytes) -> str:
    """The message of any SGLang / router error shape (docs/sglang.md sections 6, 7)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")[:500] or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, str):
            return error
        if isinstance(error, dict):
            code = error.get("code")
            message = str(error.get("message", error))
            return f"{message} ({code})" if isinstance(code, str) else message
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return str(data)[:500]


def read_output(data: Any, rid: str, url: str) -> EngineOutput:
    """A whole (non-streamed) ``/generate`` answer of request ``rid`` from the engine at ``url``."""
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(url, f"request {rid}: unexpected /generate answer {data!r:.200}")
    meta = data["meta_info"]
    ids, logprobs = _triples(_raw_triples(meta, rid, url), rid, url)
    out = _output(meta, rid, url, ids, logprobs, start=0)
    out.top_logprobs = _tops(meta, 0)
    return out


async def read_stream(
    batches: AsyncIterator[bytes], rid: str, url: str
) -> AsyncIterator[EngineOutput]:
    """A streamed answer's SSE lines, in blocks as they arrived (``StreamedResponse.batches``:
    whole lines, each ending with ``\\n``), as each chunk's new tokens; the last carries
    ``finish``. Where one block holds several cumulative chunks, the last alone is read when it
    holds every new token of them (:class:`_Chunks`)."""
    chunks = _Chunks(rid, url)
    async for block in batches:
        spans, done = _payloads(block)
        for out in chunks.read(block, spans):
            yield out
            if out.finish is not None:
                await _drain(batches)
                return
        if done:
            break
    raise EngineError(url, f"request {rid}: the stream ended without a finish_reason")


_SPACE = b" \t\r\n\x0b\x0c"


def _payloads(block: bytes) -> tuple[list[tuple[int, int]], bool]:
    """Where the ``data:`` payloads of a block's SSE lines are, up to ``[DONE]``, and whether
    it came. Found in place: a payload is copied only when it is read. Each ``data:`` that
    starts a line is found by a search in C, so the lines between (the blank ones that end
    events, comments) take no Python step."""
    spans: list[tuple[int, int]] = []
    at = block.find(b"data:")
    while at >= 0:
        if at and block[at - 1] != 0x0A:  # not at a line's start: inside another line
            at = block.find(b"data:", at + 5)
            continue
        start = at + 5
        stop = block.find(b"\n", start)
        if stop < 0:
            stop = len(block)
        at = block.find(b"data:", stop)
        while stop > start and block[stop - 1] == 0x0D:  # a "\r\n" line end
            stop -= 1
        if block.startswith(b" ", start):  # "data: " (orjson reads past other spaces)
            start += 1
        else:
            while start < stop and block[start] in _SPACE:
                start += 1
            while stop > start and block[stop - 1] in _SPACE:
                stop -= 1
        if stop - start < 16 and block[start:stop].strip() == b"[DONE]":
            return spans, True
        spans.append((start, stop))
    return spans, False


class _Chunks:
    """One stream's chunks read in order: each one's new tokens.

    Cumulative chunks (SGLang's default) repeat every token so far; incremental ones
    (``--incremental-streaming-output``) carry only the new ones, with a cumulative count. Only
    the new ones are read, and a cumulative chunk is cut to them before it is parsed
    (:mod:`dressage.proxy.cumulative`), unless its count says the cut went wrong.

    Several chunks that arrived together (a coalescing reader's batch) are read from the last
    one alone where that gives what reading each would: a cumulative chunk whose count is the
    tokens read so far plus its new ones, no abort (an error abort fails the call after the
    tokens before it), and each token's weight version known: from the chunk's per-token spans,
    or else the chunk's version equals the one read before it (versions only grow, so every
    chunk between had it too). Several incremental chunks are read in one pass
    (:meth:`_increments`) where each is a plain next increment. Otherwise each chunk is read in
    turn, and their tokens go on as one output: the tokens of a block reach the agent in one
    delta however the engine sent them. A chunk that fails the call (a bad chunk, an error
    abort) does so after the tokens before it.
    """

    def __init__(self, rid: str, url: str) -> None:
        self.rid = rid
        self.url = url
        self.received = 0
        self.cut = CumulativeCut()
        self.version: int | None = None
        """The weight version of the last chunk read (None before the first)."""
        self.incremental = False

    def read(self, block: bytes, spans: list[tuple[int, int]]) -> Iterator[EngineOutput]:
        """The new tokens of the chunks at ``spans`` of ``block``."""
        if len(spans) > 1 and self.version is not None:
            if self.incremental:
                out = self._increments(block, spans)
            else:
                start, stop = spans[-1]
                out = self._last_of(block[start:stop])
            if out is not None:
                yield out
                return
        joined: EngineOutput | None = None
        try:
            for start, stop in spans:
                out = self._chunk(block[start:stop])
                joined = out if joined is None else _join(joined, out)
                if out.finish is not None:
                    break
        except EngineError:
            if joined is not None:  # the tokens before the chunk that failed, then the failure
                yield joined
            raise
        if joined is not None:
            yield joined

    def _chunk(self, payload: bytes) -> EngineOutput:
        short, was_cut = self.cut(payload)
        meta = _chunk_meta(short, payload, self.rid, self.url)
        triples = _raw_triples(meta, self.rid, self.url)
        count = meta.get("completion_tokens")
        if was_cut and count != self.received + len(triples):
            meta = _chunk_meta(payload, payload, self.rid, self.url)
            triples = _raw_triples(meta, self.rid, self.url)
            count = meta.get("completion_tokens")
            was_cut = False
        if was_cut:
            start = 0
        elif count is None or count == len(triples):
            start = self.received
        else:
            start = 0
            self.incremental = True
        ids, logprobs = _triples(triples[start:], self.rid, self.url)
        return self._emit(meta, ids, logprobs, start)

    def _last_of(self, payload: bytes) -> EngineOutput | None:
        """The new tokens of several chunks from the last of them, or None (nothing read)."""
        state = self.cut.state()
        try:
            short, was_cut = self.cut(payload)
            meta = _chunk_meta(short, payload, self.rid, self.url)
            triples = meta.get("output_token_logprobs")
            if isinstance(triples, list) and self._holds_all(meta, len(triples), was_cut):
                start = 0 if was_cut else self.received
                ids, logprobs = _triples(triples[start:], self.rid, self.url)
                return self._emit(meta, ids, logprobs, start)
        except EngineError:
            pass
        self.cut.restore(state)
        return None

    def _increments(self, block: bytes, spans: list[tuple[int, int]]) -> EngineOutput | None:
        """The new tokens of several incremental chunks as one output, read in one pass
        without the per-chunk steps (the cut, an output each, the join); the same output as
        reading each and joining them. None (nothing read) where a chunk is not a plain next
        increment: not JSON, an error, an abort, a count other than the tokens so far plus
        its own, a malformed triple. Such chunks are then read one by one, which says what
        was wrong and where."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        tops: list[list[tuple[float, int]]] = []
        received = self.received
        first: dict[str, Any] | None = None  # whose prompt counts the output takes
        meta: dict[str, Any] = {}
        finish: Any = None
        shown: Any = ""  # the last weight version given (the joined output's)
        for start, stop in spans:
            try:
                data = orjson.loads(block[start:stop])
            except orjson.JSONDecodeError:
                return None
            if type(data) is not dict or "error" in data or type(data.get("meta_info")) is not dict:
                return None
            meta = data["meta_info"]
            triples = meta.get("output_token_logprobs")
            finish = meta.get("finish_reason")
            if (
                type(triples) is not list
                or meta.get("completion_tokens") != received + len(triples)
                or (finish is not None and (type(finish) is not dict or _is_abort(finish)))
            ):
                return None
            try:
                new_ids, new_logprobs = _triples(triples, self.rid, self.url)
            except EngineError:
                return None
            ids += new_ids
            logprobs += new_logprobs
            given = meta.get("weight_version", "")
            if given != "":
                shown = given
            if meta.get("weight_versions"):
                versions += token_versions(meta, received, len(triples))
            else:
                versions += [parse_version(given)] * len(triples)
            if "output_top_logprobs" in meta:
                tops += _tops(meta, 0)
            received += len(triples)
            if first is None or first.get("prompt_tokens") is None:
                first = meta
            if finish is not None:
                break
        assert first is not None
        self.cut.restore(({}, self.cut.state()[1]))  # as reading these small chunks leaves it
        self.received = received
        self.version = parse_version(meta.get("weight_version"))
        return EngineOutput(
            rid=self.rid,
            output_ids=ids,
            logprobs=logprobs,
            versions=versions,
            finish=finish,
            weight_version=str(shown),
            prompt_tokens=first.get("prompt_tokens"),
            cached_tokens=first.get("cached_tokens"),
            top_logprobs=tops,
        )

    def _holds_all(self, meta: dict[str, Any], listed: int, was_cut: bool) -> bool:
        """Whether a chunk with ``listed`` per-token entries (only the new ones if ``was_cut``)
        holds every token since the last one read, each with its weight version, and no
        abort (see the class docstring)."""
        count = meta.get("completion_tokens")
        finish = meta.get("finish_reason")
        spans = meta.get("weight_versions")
        if not isinstance(count, int) or (
            isinstance(finish, dict) and finish.get("type") == "abort"
        ):
            return False
        if not (isinstance(spans, list) and spans):
            if parse_version(meta.get("weight_version")) != self.version:
                return False
        if was_cut:
            return count == self.received + listed
        return count == listed >= self.received

    def _emit(
        self, meta: dict[str, Any], ids: list[int], logprobs: list[float], start: int
    ) -> EngineOutput:
        """``ids`` (from position ``start`` of the chunk's lists) as the stream's next tokens."""
        out = _output(meta, self.rid, self.url, ids, logprobs, start=self.received)
        out.top_logprobs = _tops(meta, start)
        self.received += len(ids)
        self.version = parse_version(meta.get("weight_version"))
        return out


def _is_abort(finish: dict[str, Any]) -> bool:
    return bool(finish.get("type") == "abort")


def _join(first: EngineOutput, then: EngineOutput) -> EngineOutput:
    """``first`` extended by the stream's next output ``then``, as the controller's
    ``Generation`` adds them: the tokens in order, the last finish and weight version, the
    first prompt counts."""
    first.output_ids += then.output_ids
    first.logprobs += then.logprobs
    first.versions += then.versions
    first.top_logprobs += then.top_logprobs
    first.finish = then.finish
    first.weight_version = then.weight_version or first.weight_version
    if first.prompt_tokens is None:
        first.prompt_tokens, first.cached_tokens = then.prompt_tokens, then.cached_tokens
    return first


def _chunk_meta(text: bytes, payload: bytes, rid: str, url: str) -> dict[str, Any]:
    """The ``meta_info`` of a stream chunk (``text``: the chunk, perhaps cut; ``payload``: as
    sent, for the messages)."""
    try:
        data = loads_engine(text)
    except ValueError:
        raise EngineError(url, f"request {rid}: bad stream chunk {payload!r:.200}") from None
    if isinstance(data, dict) and "error" in data:
        raise EngineRejectedError(url, 400, error_message(payload))
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(url, f"request {rid}: unexpected chunk {data!r:.200}")
    return data["meta_info"]


DRAIN_S = 1.0
"""How long a stream's rest (``[DONE]``, the end of the body) is waited for after its finish."""


async def _drain(batches: AsyncIterator[bytes]) -> None:
    """Read the stream past its finish: SGLang sends ``data: [DONE]`` and ends the body at once,
    and a body read to its end lets the connection serve the next request (left unread, it is
    closed, and the next streamed call opens another). The answer is whole already, so what
    fails here, or takes longer than :data:`DRAIN_S`, only costs the connection."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in batches:
                pass
    except (TimeoutError, ConnectionError, OSError, ValueError, asyncio.IncompleteReadError):
        return


def _tops(meta: dict[str, Any], start: int) -> list[list[tuple[float, int]]]:
    """``output_top_logprobs`` from position ``start`` on: ``[[logprob, id, text], ...]`` per
    position (null where the engine has none)."""
    raw = meta.get("output_top_logprobs")
    if not isinstance(raw, list):
        return []
    out = []
    for position in raw[start:]:
        entries = position if isinstance(position, list) else []
        out.append(
            [(float(e[0]), int(e[1])) for e in entries if isinstance(e, list) and len(e) >= 2]
        )
    return out


def _output(
    meta: dict[str, Any], rid: str, url: str, ids: list[int], logprobs: list[float], *, start: int
) -> EngineOutput:
    """``ids`` (output tokens ``start ..`` of the answer) with what ``meta`` says of them."""
    finish = meta.get("finish_reason")
    _raise_for_error_abort(finish, url, rid)
    return EngineOutput(
        rid=rid,
        output_ids=ids,
        logprobs=logprobs,
        versions=token_versions(meta, start, len(ids)),
        finish=finish if isinstance(finish, dict) else None,
        weight_version=str(meta.get("weight_version", "")),
        prompt_tokens=meta.get("prompt_tokens"),
        cached_tokens=meta.get("cached_tokens"),
    )


def _raise_for_error_abort(finish: Any, url: str, rid: str) -> None:
    """An abort that carries an error status is a failure, not a partial output (section 7)."""
    if isinstance(finish, dict) and finish.get("type") == "abort":
        status = finish.get("status_code")
        if isinstance(status, int) and status >= 400:
            message = str(finish.get("message") or "aborted")
            if status == 503:
                raise EngineUnavailableError(url, f"request {rid}: {message}")
            raise EngineRejectedError(url, status, f"request {rid}: {message}")
