"""The proxy's HTTP/1.1 client (:mod:`dressage.proxy.http1`) against a raw server that sends
exactly the bytes a test gives, in the pieces it gives, with pauses: chunked bodies whose chunks
arrive split or several at once, trailers, a stream that goes quiet, bad framing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest

from dressage.proxy.http1 import HTTP1Pool, ProtocolFailure

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def _server(pieces: Sequence[bytes | float | None]) -> AsyncIterator[str]:
    """A server answering each request with ``pieces``: bytes are written, a float pauses,
    None closes the connection."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")), 0,
                )  # fmt: skip
                await reader.readexactly(length)
                for piece in pieces:
                    if piece is None:
                        return
                    if isinstance(piece, float):
                        await asyncio.sleep(piece)
                    else:
                        writer.write(piece)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test's server is closing
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


async def _lines(
    pieces: Sequence[bytes | float | None], timeout: float | None = 5.0
) -> list[bytes]:
    async with _server(pieces) as url:
        pool = HTTP1Pool(url)
        try:
            async with pool.stream("POST", "/generate", b"{}", timeout=timeout) as response:
                return [line async for line in response.lines()]
        finally:
            await pool.aclose()


EVENTS = [b'data: {"a": %d}\n\n' % i for i in range(5)]
WANT = [line for i in range(5) for line in (b'data: {"a": %d}' % i, b"")]


def test_chunks_that_arrive_one_by_one_give_every_line() -> None:
    pieces: list[bytes | float | None] = [HEAD]
    for event in EVENTS:
        pieces += [_chunk(event), 0.005]
    pieces.append(b"0\r\n\r\n")
    assert asyncio.run(_lines(pieces)) == WANT


def test_chunks_arriving_together_or_split_anywhere_give_the_same_lines() -> None:
    body = b"".join(_chunk(e) for e in EVENTS) + b"0\r\n\r\n"
    assert asyncio.run(_lines([HEAD + body])) == WANT
    for cut in (1, 3, 7, len(body) // 2, len(body) - 3):  # inside a size line, data, a CRLF
        assert asyncio.run(_lines([HEAD, body[:cut], 0.005, body[cut:]])) == WANT


def test_trailers_and_chunk_extensions_are_read_past() -> None:
    body = b"5;name=x\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n"
    assert asyncio.run(_lines([HEAD, body])) == [b"hello"]


def test_a_stream_that_goes_quiet_fails_after_its_timeout_not_before() -> None:
    slow: list[bytes | float | None] = [
        HEAD,
        _chunk(EVENTS[0]),
        0.15,
        _chunk(EVENTS[1]),
        0.15,
        b"0\r\n\r\n",
    ]
    assert asyncio.run(_lines(slow, timeout=0.5)) == WANT[:4]  # pauses under the timeout
    quiet: list[bytes | float | None] = [HEAD, _chunk(EVENTS[0]), 5.0, b"0\r\n\r\n"]
    with pytest.raises(ProtocolFailure, match="no data for 0.3 s"):
        asyncio.run(_lines(quiet, timeout=0.3))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"zz\r\nhello\r\n", "bad chunk size line"),
        (b"-5\r\nhello\r\n", "bad chunk size line"),
        (_chunk(b"hello") + b"0\r\n\r\nextra", "bytes after the chunked body"),
        (_chunk(b"hello") + b"5\r\nhel", "closed a chunked body mid-stream"),
    ],
)
def test_bad_chunked_framing_is_a_protocol_failure(body: bytes, message: str) -> None:
    async def run() -> None:
        async with _server([HEAD, body, None]) as url:
            pool = HTTP1Pool(url)
            try:
                async with pool.stream("POST", "/g", b"{}", timeout=5.0) as response:
                    async for _ in response.lines():
                        pass
            finally:
                await pool.aclose()

    with pytest.raises(ProtocolFailure, match=message):
        asyncio.run(run())


def test_a_whole_chunked_answer_is_read_and_its_connection_reused() -> None:
    body = HEAD + _chunk(b'{"ok": 1}') + b"0\r\n\r\n"

    async def run() -> list[bytes]:
        async with _server([body]) as url:
            pool = HTTP1Pool(url)
            try:
                first = await pool.request("POST", "/g", b"{}")
                second = await pool.request("POST", "/g", b"{}")
                assert len(pool._idle) == 1  # one connection served both
                return [first.body, second.body]
            finally:
                await pool.aclose()

    assert asyncio.run(run()) == [b'{"ok": 1}', b'{"ok": 1}']


def test_a_slow_reader_is_not_an_idle_engine() -> None:
    """The timeout bounds each wait for bytes, not the time the reader spends between reads."""
    pieces: list[bytes | float | None] = [HEAD]
    pieces += [_chunk(e) for e in EVENTS] + [b"0\r\n\r\n"]

    async def run() -> list[bytes]:
        async with _server(pieces) as url:
            pool = HTTP1Pool(url)
            try:
                async with pool.stream("POST", "/g", b"{}", timeout=0.2) as response:
                    lines = []
                    async for line in response.lines():
                        lines.append(line)
                        await asyncio.sleep(0.1)  # 1 s in all, five times the timeout
                assert len(pool._idle) == 1, "the connection was dropped"
                return lines
            finally:
                await pool.aclose()

    assert asyncio.run(run()) == WANT


def test_a_large_chunk_over_many_reads_is_read_whole() -> None:
    data = bytes(range(256)) * 8192  # 2 MiB in one chunk: some 32 reads of 64 KiB
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    body = head + _chunk(data) + _chunk(b"tail") + b"0\r\n\r\n"

    async def run() -> bytes:
        async with _server([body]) as url:
            pool = HTTP1Pool(url)
            try:
                return (await pool.request("POST", "/g", b"{}")).body
            finally:
                await pool.aclose()

    assert asyncio.run(run()) == data + b"tail"


def _coalesced(pieces: Sequence[bytes | float | None], coalesce: float) -> tuple[list, float]:
    """The batches of a stream read with ``coalesce``, and the seconds it took."""

    async def run() -> tuple[list, float]:
        async with _server(pieces) as url:
            pool = HTTP1Pool(url)
            try:
                loop = asyncio.get_running_loop()
                started = loop.time()
                async with pool.stream("POST", "/g", b"{}", timeout=5.0, coalesce=coalesce) as r:
                    batches = [batch async for batch in r.batches()]
                return batches, loop.time() - started
            finally:
                await pool.aclose()

    return asyncio.run(run())


def test_a_coalescing_reader_gathers_what_arrives_in_its_window() -> None:
    """Eleven events 20 ms apart, read with a 100 ms window: the first comes alone and at once,
    the rest in a few reads (each within a window of the one before), every line once, and
    the body's end waits out at most one window."""
    events = [b'data: {"a": %d}\n\n' % i for i in range(11)]
    pieces: list[bytes | float | None] = [HEAD, _chunk(events[0])]
    for event in events[1:]:
        pieces += [0.02, _chunk(event)]
    pieces += [_chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    batches, seconds = _coalesced(pieces, 0.1)
    assert b"".join(batches) == b"".join(events) + b"data: [DONE]\n\n"
    assert batches[0] == events[0]
    assert 3 <= len(batches) <= 6, batches  # 200 ms of events after the first: 2-3 windows
    assert seconds < 0.2 + 0.1 + 0.15


def test_a_coalescing_reader_reads_a_closed_connection_to_its_end() -> None:
    """A body with neither a length nor chunks runs to the close: read whole after the window."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    pieces: list[bytes | float | None] = [head, b"data: 1\n\n", 0.01, b"data: 2\n\n", None]
    batches, _ = _coalesced(pieces, 0.05)
    assert batches == [b"data: 1\n\n", b"data: 2\n\n"]


def test_coalescing_streams_read_at_the_ticks_of_one_clock() -> None:
    """Two streams of events 10 ms apart, read with a 100 ms window, the second started 30 ms
    after the first: after its first read, each stream reads just after the multiples of
    100 ms on the loop's clock, so one wake-up of the loop serves both (each waiting 100 ms
    after its own last read, they would read 30 ms apart, and at least one of them 25 ms or
    more after a tick)."""
    period = 0.1
    events = [b'data: {"a": %d}\n\n' % i for i in range(40)]
    pieces: list[bytes | float | None] = [HEAD, _chunk(events[0])]
    for event in events[1:]:
        pieces += [0.01, _chunk(event)]
    pieces += [_chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]

    async def run() -> list[list[float]]:
        async with _server(pieces) as url:
            pool = HTTP1Pool(url)
            loop = asyncio.get_running_loop()

            async def stream(start: float) -> list[float]:
                await asyncio.sleep(start)
                times = []
                async with pool.stream("POST", "/g", b"{}", timeout=5.0, coalesce=period) as r:
                    async for _ in r.batches():
                        times.append(loop.time())
                return times

            try:
                return list(await asyncio.gather(stream(0.0), stream(0.03)))
            finally:
                await pool.aclose()

    for times in asyncio.run(run()):
        phases = sorted(t % period for t in times[1:])
        assert len(phases) >= 3, times
        assert phases[len(phases) // 2] < 0.25 * period, phases
