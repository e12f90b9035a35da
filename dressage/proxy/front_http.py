"""HTTP/1.1 framing for the front of ``dressage-proxy --workers N``: heads and byte-exact relays.

The front reads no more of a request than its head (the request line and headers) to route it;
bodies and answers go through as the bytes that came, in both directions, relayed by their
framing (``Content-Length``, ``chunked``, or the end of the connection for an answer). The head
is parsed by ``httptools`` (uvicorn's parser, which the workers use too, so front and workers
agree on where a request ends); a request whose framing is ambiguous (``Transfer-Encoding`` other
than ``chunked``, or beside a ``Content-Length``; several lengths) is refused before it reaches
a worker.
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote

import httptools

__all__ = [
    "HEAD_LIMIT",
    "BadRequest",
    "RequestHead",
    "ResponseHead",
    "parse_request",
    "parse_response",
    "read_body",
    "relay_body",
]

HEAD_LIMIT = 64 * 1024
"""Largest head the front reads (the workers' limit too)."""
_WHOLE = 256 * 1024
"""Bodies up to this size are read whole and written with their head in one write."""
_PIECE = 256 * 1024


class BadRequest(ValueError):
    """A request the front cannot frame; the message is one sentence for the client."""


class _Head:
    __slots__ = ("chunked", "close", "headers", "length", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.headers: list[tuple[bytes, bytes]] = []
        self.length: int | None = None
        self.chunked = False
        self.close = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def _framing(self) -> None:
        lengths = {v.strip() for k, v in self.headers if k == b"content-length"}
        codings = [v.strip().lower() for k, v in self.headers if k == b"transfer-encoding"]
        if codings:
            if codings != [b"chunked"] or lengths:
                raise BadRequest(
                    "Transfer-Encoding must be 'chunked' alone, without Content-Length"
                )
            self.chunked = True
        elif lengths:
            if len(lengths) > 1 or not next(iter(lengths)).isdigit():
                raise BadRequest("Content-Length must be one decimal number")
            self.length = int(next(iter(lengths)))
        connection = (self.get(b"connection") or b"").lower()
        self.close = b"close" in connection


class RequestHead(_Head):
    __slots__ = ("method", "path", "target")

    def __init__(self, raw: bytes) -> None:
        super().__init__(raw)
        self.target = b""
        self.method = b""
        self.path = ""

    def on_url(self, url: bytes) -> None:
        self.target += url


class ResponseHead(_Head):
    __slots__ = ("status",)

    def __init__(self, raw: bytes) -> None:
        super().__init__(raw)
        self.status = 0


def parse_request(raw: bytes) -> RequestHead:
    """The head of a request (``raw`` ends with its blank line); BadRequest when unframable."""
    head = RequestHead(raw)
    parser = httptools.HttpRequestParser(head)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass
    except httptools.HttpParserError as exc:
        raise BadRequest(f"the request head is not HTTP/1.1: {exc}") from None
    head.method = parser.get_method()
    head._framing()
    if head.length is None and not head.chunked:
        head.length = 0  # a request without a length has no body
    if parser.get_http_version() == "1.0" and not parser.should_keep_alive():
        head.close = True
    path = head.target.split(b"?", 1)[0].decode("ascii", "replace")
    head.path = unquote(path) if "%" in path else path
    return head


def parse_response(raw: bytes, method: bytes) -> ResponseHead:
    """The head of a worker's answer to ``method``."""
    head = ResponseHead(raw)
    parser = httptools.HttpResponseParser(head)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserError as exc:
        raise ConnectionError(f"a worker answered no HTTP/1.1: {exc}") from None
    head.status = parser.get_status_code()
    head._framing()
    if parser.get_http_version() == "1.0" and not parser.should_keep_alive():
        head.close = True
    no_body = method == b"HEAD" or head.status in (204, 304) or head.status < 200
    if no_body:
        head.length, head.chunked = 0, False
    elif head.length is None and not head.chunked:
        head.close = True  # the body ends with the connection
    return head


async def _relay_length(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int
) -> None:
    while length > 0:
        piece = await reader.read(min(length, _PIECE))
        if not piece:
            raise ConnectionError("the connection ended inside a body")
        writer.write(piece)
        length -= len(piece)
        await writer.drain()


async def _relay_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ConnectionError("a chunk size is not hexadecimal") from None
        if size == 0:
            writer.write(line)
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(b"\r\n")
            await writer.drain()
            return
        if size + 2 <= _WHOLE:
            writer.write(line + await reader.readexactly(size + 2))
            await writer.drain()
        else:
            writer.write(line)
            await _relay_length(reader, writer, size + 2)


async def relay_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: _Head
) -> None:
    """Write ``head`` and then its body as it comes from ``reader``, byte for byte."""
    if head.chunked:
        writer.write(head.raw)
        await _relay_chunked(reader, writer)
    elif head.length is not None:
        if head.length <= _WHOLE:
            body = await reader.readexactly(head.length) if head.length else b""
            writer.write(head.raw + body)
            await writer.drain()
        else:
            writer.write(head.raw)
            await _relay_length(reader, writer, head.length)
    else:  # an answer whose body ends with the connection
        writer.write(head.raw)
        while piece := await reader.read(_PIECE):
            writer.write(piece)
            await writer.drain()


async def read_body(reader: asyncio.StreamReader, head: _Head, limit: int) -> bytes | None:
    """The whole body of a request (chunks joined), or None when it is over ``limit`` bytes
    (then nothing more is read: the connection cannot be reused)."""
    if head.length is not None:
        return await reader.readexactly(head.length) if head.length <= limit else None
    if not head.chunked:
        return b""
    parts: list[bytes] = []
    size_total = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadRequest("a chunk size is not hexadecimal") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        size_total += size
        if size_total > limit:
            return None
        parts.append((await reader.readexactly(size + 2))[:-2])
