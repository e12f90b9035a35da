"""A small HTTP/1.1 keep-alive client on asyncio streams: the proxy's path to ``/generate``.

Why not httpx here: measured on the 2-core CI machine against a server answering at once, an
``httpx.AsyncClient`` POST costs 1.6-2 ms of CPU, more than the proxy's whole per-call budget
(bench/proxy.py); this client costs about 0.1 ms. It speaks exactly what the engine port needs:
one request per connection at a time, ``Content-Length`` or ``chunked`` bodies, keep-alive with
an idle pool, streamed bodies read line by line (SSE), their arrivals gathered for a while if
asked (``coalesce``). Control-plane calls (``/workers``,
``/model_info``, aborts) are rare and go through httpx in :mod:`~dressage.proxy.engine_client`.

    pool = HTTP1Pool("http://127.0.0.1:30000")
    response = await pool.request("POST", "/generate", body, headers=[("content-type", ...)])
    async with pool.stream("POST", "/generate", body) as streamed:
        async for line in streamed.lines(): ...
    async with pool.stream("POST", "/generate", body, coalesce=0.02) as streamed:
        async for block in streamed.batches(): ...       # the lines that came in 20 ms
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

__all__ = ["ConnectFailed", "HTTP1Pool", "ProtocolFailure", "RawResponse", "StreamedResponse"]

_MAX_HEADER_BYTES = 64 * 1024
_LIMIT = _MAX_HEADER_BYTES * 16
"""The reader's limit: a response head must fit, and its socket pauses past twice this."""
_READ_BYTES = 4 * _LIMIT


class ConnectFailed(ConnectionError):
    """No connection, or it dropped before any byte of the response: the request is retryable."""


class ProtocolFailure(ConnectionError):
    """The connection broke, timed out or spoke garbage after the response had started."""


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes


class _Conn:
    __slots__ = ("reader", "transport", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        # a socket connection's transport reads too (the writer's type says only "writes")
        self.transport = cast(asyncio.Transport, writer.transport)

    def close(self) -> None:
        self.writer.close()


class StreamedResponse:
    """A response whose body is read as it arrives (``lines()``); close it by leaving the block.

    Each arrival of bytes is one read, however many ``chunked`` chunks it holds: the chunk
    framing is decoded from a buffer, not with a read per size line and per chunk. ``timeout``
    bounds each wait for more of the body: a watchdog timer, not a timeout per read, aborts the
    connection once a read has waited that long (the read then fails as a
    :class:`ProtocolFailure` that says so).

    ``coalesce`` (seconds, 0 for none): after a read, the next waits for the next tick of a
    clock of that period, and takes everything that arrived meanwhile, so that a body arriving
    in many small pieces (an engine's stream, a chunk per token) is handed on in fewer, larger
    ones. Meanwhile the connection's socket is not watched: the kernel gathers the bytes, and
    their arrivals wake nothing (a wake-up and a read cost some 15 µs each, measured). The
    ticks are the same for every stream of the process (multiples of the period on the loop's
    clock), so that one wake-up of the loop serves every stream that is waiting. The first
    read is not held back; the last waits out the window it falls in (at most one period).
    """

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        conn: _Conn,
        timeout: float | None = None,
        coalesce: float = 0.0,
    ) -> None:
        self.status = status
        self._timeout = timeout
        self._coalesce = coalesce
        self._last_read: float | None = None
        """When the last read ended, on the loop's clock (None before the first)."""
        self.headers = headers
        self._conn = conn
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self._remaining = int(length) if length is not None and not self._chunked else -1
        self.complete = False
        self._waiting_since = 0.0
        self._reading = False
        self._timed_out = False
        self._watchdog: asyncio.TimerHandle | None = None

    async def _read(self) -> bytes:
        loop = asyncio.get_running_loop()
        if self._coalesce and self._last_read is not None:
            # the first tick of the coalescing clock after the last read: the streams of one
            # proxy read at the same ticks, so that one wake-up of the loop serves them all
            tick = (math.floor(self._last_read / self._coalesce) + 1) * self._coalesce
            delay = tick - loop.time()
            if delay > 0:  # let the bytes gather in the socket: no wake-up for each arrival
                transport = self._conn.transport
                transport.pause_reading()
                try:
                    await asyncio.sleep(delay)
                finally:
                    if not transport.is_closing():
                        transport.resume_reading()
        self._waiting_since = loop.time()  # the watchdog's clock
        self._reading = True
        try:
            # All that is buffered (the reader pauses its socket past twice its limit).
            data = await self._conn.reader.read(_READ_BYTES)
        except (ConnectionError, OSError):
            if self._timed_out:
                raise ProtocolFailure(f"no data for {self._timeout} s") from None
            raise
        finally:
            self._reading = False
        if self._timed_out:
            raise ProtocolFailure(f"no data for {self._timeout} s")
        if self._coalesce:
            self._last_read = loop.time()
        return data

    def _watch(self) -> None:
        """Start the watchdog (none without a timeout): it aborts the connection once a read
        has waited ``timeout`` seconds, and else looks again when that could first be so (the
        time the reader spends between reads does not count)."""
        if self._timeout is None:
            return
        loop = asyncio.get_running_loop()
        timeout = self._timeout

        def check() -> None:
            now = loop.time()
            if self._reading and now >= self._waiting_since + timeout:
                self._timed_out = True
                self._conn.writer.transport.abort()
                return
            due = self._waiting_since + timeout if self._reading else now + timeout
            self._watchdog = loop.call_at(due, check)

        self._watchdog = loop.call_at(loop.time() + timeout, check)

    async def _pieces(self) -> AsyncIterator[bytes]:
        self._watch()
        try:
            if self._chunked:
                async for piece in self._dechunked():
                    yield piece
            elif self._remaining >= 0:
                while self._remaining > 0:
                    data = await self._read()
                    if not data:
                        raise ProtocolFailure("the engine closed the connection mid-body")
                    if len(data) > self._remaining:
                        raise ProtocolFailure("the engine sent more than its content-length")
                    self._remaining -= len(data)
                    yield data
            else:  # no length: the body runs until the server closes the connection
                while data := await self._read():
                    yield data
            self.complete = True
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()

    async def _dechunked(self) -> AsyncIterator[bytes]:
        """The data of a ``chunked`` body, every complete chunk of each arrival joined (one
        copy of the data). A chunk that takes many reads is gathered in place (a
        ``bytearray``), not copied at each."""
        buffer = bytearray()  # what is left of earlier reads: a chunk not all here yet
        while True:
            data = await self._read()
            if not data:
                raise ProtocolFailure("the engine closed a chunked body mid-stream")
            source: bytes | bytearray = data
            if buffer:
                buffer += data
                source = buffer
            joined, at, last = _chunks_of(source)
            if last >= 0:  # the last chunk: then trailers, up to an empty line
                if joined:
                    yield joined
                await self._trailers(bytes(source[last:]))
                return
            if source is buffer:
                del buffer[:at]
            elif at < len(data):
                buffer += memoryview(data)[at:]
            if joined:
                yield joined

    async def _trailers(self, rest: bytes) -> None:
        """Read past the trailers (``rest`` is what came after the last chunk's size line)."""
        while True:
            if rest.startswith((b"\r\n", b"\n")):
                if rest.lstrip(b"\r\n"):
                    raise ProtocolFailure("the engine sent bytes after the chunked body")
                return
            for end_mark in (b"\r\n\r\n", b"\n\n"):
                if end_mark in rest:
                    if rest.split(end_mark, 1)[1]:
                        raise ProtocolFailure("the engine sent bytes after the chunked body")
                    return
            data = await self._read()
            if not data:
                return
            rest += data

    async def batches(self) -> AsyncIterator[bytes]:
        """The body's lines as they arrive: every line that a read completed, in one block of
        bytes that ends with a ``\\n`` (a last unterminated line comes at the end, ``\\n``
        added). A block is not split into lines here: a reader that needs only some of them
        (the last of several cumulative stream chunks) copies only those."""
        pending = b""
        async for piece in self._pieces():
            if pending:
                piece = pending + piece
            cut = piece.rfind(b"\n") + 1
            if cut == len(piece):
                pending = b""
                yield piece
            elif cut:
                pending = piece[cut:]
                yield piece[:cut]
            else:
                pending = piece
        if pending:
            yield pending + b"\n"

    async def lines(self) -> AsyncIterator[bytes]:
        """Body lines without their ``\\n`` (and ``\\r``); a last unterminated line is yielded."""
        async for block in self.batches():
            for line in block.split(b"\n")[:-1]:
                yield line.rstrip(b"\r")

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self._pieces()])


def _chunks_of(source: bytes | bytearray) -> tuple[bytes, int, int]:
    """The data of the complete chunks at the start of ``source`` joined, where the rest
    starts, and where the bytes after the last chunk's size line start (-1: not come yet).
    Each chunk's data is a view until the join: its bytes are copied once."""
    pieces: list[memoryview] = []
    at = 0  # where the next size line starts
    with memoryview(source) as view:
        try:
            while True:
                end = source.find(b"\n", at)
                if end < 0:
                    break
                size = _chunk_size(source[at:end])
                if size == 0:
                    return b"".join(pieces), at, end + 1
                stop = end + 1 + size
                if len(source) < stop + 2:
                    break  # the chunk is not all here yet
                pieces.append(view[end + 1 : stop])
                at = stop + 2
            return b"".join(pieces), at, -1
        finally:
            pieces.clear()  # the views go before ``view`` is released


def _chunk_size(line: bytes | bytearray) -> int:
    """A chunk's size from its size line (``\\r`` and extensions allowed; empty is 0)."""
    try:
        size = int(line, 16)
    except ValueError:
        try:
            size = int(bytes(line).split(b";", 1)[0].strip() or b"0", 16)
        except ValueError:
            raise ProtocolFailure(f"bad chunk size line {bytes(line[:40])!r}") from None
    if size < 0:
        raise ProtocolFailure(f"bad chunk size line {bytes(line[:40])!r}")
    return size


class HTTP1Pool:
    """Keep-alive connections to one origin (scheme, host, port); safe for concurrent use."""

    def __init__(
        self,
        base_url: str,
        *,
        max_idle: int = 1024,
        connect_timeout: float = 10.0,
        local_address: str | None = None,
    ) -> None:
        """``local_address``: the address connections come from (the system's choice if None)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self._prefix = parts.path.rstrip("/")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self._host_header = host_header.encode("latin-1")
        self._idle: list[_Conn] = []
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._local = (local_address, 0) if local_address else None
        self._closed = False

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, ssl=self._ssl, limit=_LIMIT, local_addr=self._local
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {self.base_url}: {exc!r}") from None
        return _Conn(reader, writer)

    def _release(self, conn: _Conn, headers: dict[str, str]) -> None:
        if (
            self._closed
            or len(self._idle) >= self._max_idle
            or headers.get("connection", "").lower() == "close"
            or conn.reader.at_eof()
        ):
            conn.close()
        else:
            self._idle.append(conn)

    def _head(
        self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> bytes:
        lines = [
            f"{method} {self._prefix}{path} HTTP/1.1".encode("latin-1"),
            b"host: " + self._host_header,
            b"content-length: " + str(len(body)).encode(),
        ]
        lines += [f"{name}: {value}".encode("latin-1") for name, value in headers]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _send(
        self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> tuple[_Conn, int, dict[str, str]]:
        """Send the request and read the response head; a stale pooled connection is retried
        once on a fresh one (nothing of the response was seen, so nothing is lost)."""
        message = self._head(method, path, body, headers) + body
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                conn.writer.write(message)
                status, response_headers = await _read_head(conn.reader)
                return conn, status, response_headers
            except ProtocolFailure:
                conn.close()
                raise
            except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
                conn.close()
                if reused:
                    continue
                raise ConnectFailed(f"{self.base_url}{path}: connection lost: {exc!r}") from None
            except BaseException:
                conn.close()
                raise

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        headers: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
    ) -> RawResponse:
        """One request, its whole body read; ``timeout`` covers the whole exchange."""
        try:
            async with asyncio.timeout(timeout):
                conn, status, response_headers = await self._send(method, path, body, headers)
                streamed = StreamedResponse(status, response_headers, conn)
                try:
                    data = await streamed.read()
                except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError) as exc:
                    conn.close()
                    raise ProtocolFailure(f"{self.base_url}{path}: {exc!r}") from None
                except BaseException:
                    conn.close()
                    raise
        except TimeoutError:
            raise ProtocolFailure(f"{self.base_url}{path}: no answer within {timeout} s") from None
        self._release(conn, response_headers)
        return RawResponse(status, response_headers, data)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        headers: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        coalesce: float = 0.0,
    ) -> AsyncIterator[StreamedResponse]:
        """The response with its body unread; the connection is reused only if fully read.
        ``timeout`` bounds the wait for the response head and each read of the body;
        ``coalesce``: see :class:`StreamedResponse`."""
        try:
            async with asyncio.timeout(timeout):
                conn, status, response_headers = await self._send(method, path, body, headers)
        except TimeoutError:
            raise ProtocolFailure(f"{self.base_url}{path}: no answer within {timeout} s") from None
        streamed = StreamedResponse(status, response_headers, conn, timeout, coalesce)
        try:
            yield streamed
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError) as exc:
            conn.close()
            if isinstance(exc, ProtocolFailure):
                raise
            raise ProtocolFailure(f"{self.base_url}{path}: {exc!r}") from None
        except BaseException:
            conn.close()
            raise
        if streamed.complete:
            self._release(conn, response_headers)
        else:
            conn.close()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProtocolFailure("the response head is too large") from None
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ProtocolFailure(f"not an HTTP response: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:  # an interim response: the real one follows
            continue
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if parts[0] == "HTTP/1.0" and "connection" not in headers:
            headers["connection"] = "close"
        return status, headers
