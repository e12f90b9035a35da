"""The front of ``dressage-proxy --workers N``: one public port, N whole proxies behind it.

    dressage-proxy --engine-url http://127.0.0.1:30000 --store-dir ./proxy-store --workers 4

The front starts the N workers (:mod:`~dressage.proxy.workers`: each a proxy on a loopback port,
its store in ``STORE_DIR/worker-K``), waits until each is ready, then listens on ``--host`` /
``--port`` and prints the same ready line as a lone proxy. Per request it reads the head only:

- the session id, from the path (``/sessions/{id}/...``, ``/v1/sessions/{id}/...``) or else
  ``X-Session-Id`` / ``X-Dressage-Session-Id``, picks the worker (a stable hash of the id modulo
  N, :func:`~dressage.proxy.workers.worker_of`); a request with no session goes to the next
  worker in turn (``/v1/models``, ``/v1/capabilities``: every worker answers alike). The request
  and its answer (whole, chunked or streamed SSE) go through byte for byte, on keep-alive
  connections to the worker, the head with one line added: ``X-Forwarded-For`` with the
  client's address, last, so that the worker (whose uvicorn trusts it from loopback) keeps its
  per-address refusal budget (:mod:`~dressage.proxy.client_limits`) per client, not per front.
  The worker checks keys, limits and bodies as it always does. A client that hangs up closes
  the worker connection, so the worker aborts the call;
- the control routes (:data:`FAN_OUT`: rollout pause, resume and pause state, ``/v1/stats``,
  ``/health``, ``/ready``) go to every worker with the client's headers (its key: each worker
  checks it), and the front answers once all have: when every worker answered 2xx, one JSON
  answer by :mod:`~dressage.proxy.front_combine`'s rules (``paused`` only when every worker is;
  counts summed; each worker's answer under ``workers``), else the first failing worker's status
  and answer, with ``worker`` naming it. A worker that is restarting answers 503 for itself, so
  ``/ready`` is 200 only when every worker is ready.

A worker that dies is restarted (its store replays) and the front logs one line; when a rollout
pause is in force (the last pause or resume that any worker took was a pause), the restarted
worker is paused with the same request before it gets calls.
SIGTERM or SIGINT stops the front and every worker; a worker that refuses to serve (exit status
2: the engine's vocabulary differs) stops them all with status 2.
"""

from __future__ import annotations

import asyncio
import fcntl
import http
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from dressage.config.proxy import ProxyConfig, parser
from dressage.proxy.errors import error_body
from dressage.proxy.front_combine import combine
from dressage.proxy.front_http import (
    HEAD_LIMIT,
    BadRequest,
    RequestHead,
    parse_request,
    parse_response,
    read_body,
    relay_body,
)
from dressage.proxy.http1 import ConnectFailed, HTTP1Pool, ProtocolFailure
from dressage.proxy.workers import (
    Worker,
    WorkerFailed,
    Workers,
    claim_store,
    store_layout_error,
    worker_of,
)

__all__ = ["FAN_OUT", "Front", "serve_front", "session_of"]

log = logging.getLogger(__name__)
FAN_OUT = frozenset(
    {
        "/v1/rollout/pause",
        "/v1/rollout/resume",
        "/v1/rollout/pause_state",
        "/v1/stats",
        "/health",
        "/ready",
    }
)
"""Routes every worker answers (the front combines their answers)."""
_PAUSE, _RESUME = "/v1/rollout/pause", "/v1/rollout/resume"
_SESSION_PREFIXES = ("/sessions/", "/v1/sessions/")
_SESSION_HEADERS = (b"x-session-id", b"x-dressage-session-id")
_NOT_FORWARDED = frozenset(
    {b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"expect"}
)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_IDLE_S = 30.0
"""A pooled worker connection idle longer is not reused (the workers keep them 75 s)."""
_FAN_OUT_TIMEOUT_S = 120.0


def session_of(head: RequestHead) -> str | None:
    """The session a request belongs to, as the worker will read it (path first, then headers)."""
    for prefix in _SESSION_PREFIXES:
        if head.path.startswith(prefix):
            segment = head.path[len(prefix) :].split("/", 1)[0]
            if segment:
                return segment
    for name in _SESSION_HEADERS:
        value = head.get(name)
        if value:
            return value.decode("latin-1")
    return None


def _answer(status: int, payload: dict[str, Any], *, close: bool = False) -> bytes:
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        + ("connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode("latin-1") + body


def _error(status: int, message: str, code: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_body(message, kind, code=code)


class _Upstream:
    __slots__ = ("port", "reader", "used", "writer")

    def __init__(self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.port = port
        self.reader = reader
        self.writer = writer
        self.used = time.monotonic()


class _Client:
    """One client connection: the worker connection of its request in flight, if any."""

    __slots__ = ("forwarded", "upstream")

    def __init__(self) -> None:
        self.upstream: _Upstream | None = None
        self.forwarded = b""
        """The client's address, which the front adds to each request as the last
        ``X-Forwarded-For`` (the workers' uvicorn trusts it from loopback, so each worker's
        per-address refusal budget sees the client, not the front)."""

    def hang_up(self) -> None:
        if self.upstream is not None:  # the worker sees its client leave and aborts the call
            self.upstream.writer.transport.abort()


class _ClientProtocol(asyncio.StreamReaderProtocol):
    def __init__(self, front: Front) -> None:
        client = _Client()
        self.client = client
        super().__init__(
            asyncio.StreamReader(limit=HEAD_LIMIT), lambda r, w: front.serve(r, w, client)
        )

    def eof_received(self) -> bool:
        self.client.hang_up()
        super().eof_received()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.hang_up()
        super().connection_lost(exc)


class Front:
    """Routes requests to the workers (module docstring); one per ``dressage-proxy`` front."""

    def __init__(self, config: ProxyConfig, workers: list[Worker]) -> None:
        self.config = config
        self.workers = workers
        self._turn = itertools.cycle(range(len(workers)))
        self._idle: list[list[_Upstream]] = [[] for _ in workers]
        self._pools: dict[str, HTTP1Pool] = {}
        self._pause: tuple[str, bytes, list[tuple[str, str]]] | None = None
        """The rollout pause in force (target, body, headers), for a restarted worker."""

    def protocol(self) -> asyncio.Protocol:
        return _ClientProtocol(self)

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: _Client
    ) -> None:
        """Answer the requests of one client connection, one after the other."""
        peer = writer.get_extra_info("peername")
        client.forwarded = str(peer[0] if peer else "").encode("latin-1")
        try:
            while await self._one(reader, writer, client):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # either side broke off or spoke garbage: the connection ends
        except BadRequest as exc:
            writer.write(_answer(400, _error(400, str(exc), "bad_framing"), close=True))
        finally:
            writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: _Client
    ) -> bool:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        except asyncio.LimitOverrunError:
            message = f"the request head is over {HEAD_LIMIT} bytes"
            writer.write(_answer(431, _error(431, message, "head_too_large"), close=True))
            return False
        try:
            head = parse_request(raw)
        except BadRequest as exc:
            writer.write(_answer(400, _error(400, str(exc), "bad_framing"), close=True))
            return False
        if head.get(b"expect") == b"100-continue":
            writer.write(_CONTINUE)
        head.raw = head.raw[:-2] + b"x-forwarded-for: " + client.forwarded + b"\r\n\r\n"
        if head.path in FAN_OUT:
            keep = await self._fan_out(head, reader, writer, client)
        else:
            keep = await self._splice(head, reader, writer, client)
        return keep and not head.close

    def _pick(self, head: RequestHead) -> Worker:
        session = session_of(head)
        if session is None:
            for _ in self.workers:
                worker = self.workers[next(self._turn)]
                if worker.url is not None:
                    return worker
            return worker
        return self.workers[worker_of(session, len(self.workers))]

    async def _connect(self, worker: Worker) -> _Upstream:
        idle = self._idle[worker.index]
        now = time.monotonic()
        while idle:
            up = idle.pop()
            if up.port == worker.port and now - up.used < _IDLE_S and not up.reader.at_eof():
                return up
            up.writer.close()
        reader, writer = await asyncio.open_connection(worker.host, worker.port, limit=HEAD_LIMIT)
        return _Upstream(worker.port, reader, writer)

    async def _splice(
        self,
        head: RequestHead,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: _Client,
    ) -> bool:
        worker = self._pick(head)
        try:
            if worker.url is None:
                raise ConnectionRefusedError
            up = await self._connect(worker)
        except OSError:
            message = f"proxy worker {worker.index} is restarting; retry in a moment"
            writer.write(_answer(503, _error(503, message, "worker_unavailable"), close=True))
            return False
        if writer.transport.is_closing():  # the client left while the front connected
            up.writer.close()
            return False
        client.upstream = up
        answering = False
        try:
            await relay_body(reader, up.writer, head)
            while True:
                response = parse_response(await up.reader.readuntil(b"\r\n\r\n"), head.method)
                if response.status >= 200:
                    break
            answering = True
            await relay_body(up.reader, writer, response)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            up.writer.transport.abort()
            if not answering:  # nothing of an answer went out yet: say what happened
                message = f"proxy worker {worker.index} broke off the call; retry it"
                writer.write(_answer(502, _error(502, message, "worker_failed"), close=True))
            return False
        except BaseException:
            up.writer.transport.abort()
            raise
        finally:
            client.upstream = None
        if response.close:
            up.writer.close()
            return False
        up.used = time.monotonic()
        self._idle[worker.index].append(up)
        return True

    async def _fan_out(
        self,
        head: RequestHead,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: _Client,
    ) -> bool:
        body = await read_body(reader, head, self.config.max_request_bytes)
        if body is None:
            message = f"the request body is over {self.config.max_request_bytes} bytes"
            writer.write(_answer(413, _error(413, message, "request_too_large"), close=True))
            return False
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in head.headers
            if k not in _NOT_FORWARDED
        ]
        headers.append(("x-forwarded-for", client.forwarded.decode("latin-1")))
        target, method = head.target.decode("latin-1"), head.method.decode("latin-1")
        answers = await asyncio.gather(
            *(self._ask(w, method, target, body, headers) for w in self.workers)
        )
        status, payload = _fan_in(answers)
        if any(200 <= answer[0] < 300 for answer in answers):  # a worker took it: in force
            if head.path == _PAUSE:
                self._pause = (target, body, headers)
            elif head.path == _RESUME:
                self._pause = None
        writer.write(_answer(status, payload))
        await writer.drain()
        return True

    async def _ask(
        self,
        worker: Worker,
        method: str,
        target: str,
        body: bytes,
        headers: list[tuple[str, str]],
        url: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        url = url or worker.url
        if url is None:
            message = f"proxy worker {worker.index} is restarting"
            return 503, {"status": "not_ready", **_error(503, message, "worker_unavailable")}
        pool = self._pools.get(url)
        if pool is None:
            live = {w.url for w in self.workers} | {url}
            for gone in [u for u in self._pools if u not in live]:  # restarted workers' old ports
                await self._pools.pop(gone).aclose()
            pool = self._pools[url] = HTTP1Pool(url, max_idle=8)
        try:
            response = await pool.request(
                method, target, body, headers=headers, timeout=_FAN_OUT_TIMEOUT_S
            )
        except (ConnectFailed, ProtocolFailure) as exc:
            message = f"proxy worker {worker.index} did not answer: {exc}"
            return 503, {"status": "not_ready", **_error(503, message, "worker_unavailable")}
        try:
            payload = json.loads(response.body) if response.body else {}
        except ValueError:
            payload = {"body": response.body.decode("utf-8", "replace")}
        return response.status, payload if isinstance(payload, dict) else {"body": payload}

    async def replay_pause(self, worker: Worker) -> None:
        """Pause a restarted worker as the others are, before it gets calls."""
        if self._pause is None:
            return
        target, body, headers = self._pause
        status, payload = await self._ask(
            worker, "POST", target, body, headers, url=worker.started_url
        )
        if status != 200:
            log.error("proxy worker %d could not be paused after its restart: %s", worker.index,
                      payload)  # fmt: skip


def _fan_in(answers: Sequence[tuple[int, dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
    """Every worker 2xx: 200 and the combined answer; else the first failing worker's."""
    for index, (status, payload) in enumerate(answers):
        if not 200 <= status < 300:
            return status, {**payload, "worker": index}
    return 200, combine([payload for _, payload in answers])


def _lock(store_dir: os.PathLike[str]) -> int:
    """Hold ``STORE_DIR/LOCK`` as a lone proxy's store does: one front or proxy per folder."""
    fd = os.open(os.path.join(store_dir, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"the store {store_dir} is in use by another process (LOCK is held)"
        ) from None
    return fd


def _listen(config: ProxyConfig) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def _run(
    config: ProxyConfig, argv: Sequence[str], ready_log: logging.Logger, prog: str
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = _listen(config)
    workers = Workers(argv, config.store_dir, config.workers)
    front = Front(config, workers.all)
    workers.on_restart = front.replay_pause
    starting = asyncio.ensure_future(workers.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await workers.stop()
        return 0
    stopped.cancel()
    if (error := starting.exception()) is not None:
        print(f"{prog}: {error}", file=sys.stderr, flush=True)
        return error.status if isinstance(error, WorkerFailed) else 2
    server = await loop.create_server(front.protocol, sock=sock)
    host = f"[{config.host}]" if ":" in config.host else config.host
    port = sock.getsockname()[1]
    from dressage.proxy.server import READY_PREFIX

    print(f"{READY_PREFIX}http://{host}:{port}", flush=True)
    ready_log.info(
        "dressage proxy ready at http://%s:%d, in front of the engine at %s (store %s, "
        "%d worker processes: each session id hashes to one worker, so this store may only be "
        "served again with --workers %d)",
        host, port, config.engine_url_clean, config.store_dir, config.workers, config.workers,
    )  # fmt: skip
    waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(stop.wait()), workers.failed}
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    server.close()
    await workers.stop()
    if workers.failed.done():
        print(f"{prog}: {workers.failed.result()}", file=sys.stderr, flush=True)
        return workers.failed.result().status
    return 0


def serve_front(config: ProxyConfig, argv: Sequence[str], ready_log: logging.Logger) -> int:
    """Run the front and its ``config.workers`` workers until a signal; the exit status."""
    prog = parser().prog  # how it was started: dressage-proxy, dressage proxy serve
    refusal = store_layout_error(config.store_dir, config.workers)
    if refusal is not None:
        print(f"{prog}: {refusal}", file=sys.stderr)
        return 2
    claim_store(config.store_dir, config.workers)
    try:
        lock = _lock(config.store_dir)
    except RuntimeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return int(runner(_run(config, argv, ready_log, prog)))
    except OSError as exc:
        print(f"{prog}: cannot listen on {config.host}:{config.port}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    finally:
        os.close(lock)
