"""Keep-alive: the side that closes an idle connection must be the client (issue 15, item 7).

uvicorn closed connections idle for 5 s and the OpenAI SDK's pool reuses them for up to 5 s, so
about 1 call in 1,000 under load reused a connection the server was closing (``ReadError``).
The proxy now keeps idle connections past any common client's expiry, and its own control
client to the engine drops them before the engine's uvicorn (5 s) would.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import pytest
from openai._constants import DEFAULT_CONNECTION_LIMITS

from dressage.config.proxy import ProxyConfig
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.serving import KEEP_ALIVE_S, uvicorn_config
from dressage.proxy.testing import serve_proxy
from dressage.proxy.tito import TITOTokenizer

UVICORN_DEFAULT_KEEP_ALIVE_S = 5  # what an SGLang or embedded engine's uvicorn closes after


@pytest.mark.unit
def test_the_server_outwaits_the_clients_and_the_proxy_outwaits_no_engine() -> None:
    clients = (httpx.Limits().keepalive_expiry, DEFAULT_CONNECTION_LIMITS.keepalive_expiry, 15.0)
    assert all(expiry is not None and KEEP_ALIVE_S > 2 * expiry for expiry in clients)
    assert uvicorn_config(object()).timeout_keep_alive == KEEP_ALIVE_S

    async def control_expiry() -> float | None:
        engine = EngineClient("http://127.0.0.1:9")
        try:
            pool = engine._client()._transport._pool  # type: ignore[attr-defined]
            return pool._keepalive_expiry  # type: ignore[no-any-return]
        finally:
            await engine.aclose()

    expiry = asyncio.run(control_expiry())
    assert expiry is not None and expiry < UVICORN_DEFAULT_KEEP_ALIVE_S


@pytest.mark.integration
def test_a_connection_idle_past_the_clients_expiry_is_still_served(
    tmp_path: Path, qwen35_tito: TITOTokenizer
) -> None:
    config = ProxyConfig(engine_url="http://127.0.0.1:9", store_dir=tmp_path)
    with serve_proxy(config, tito=qwen35_tito) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            request = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            # idle past the clients' expiry and uvicorn's default, which closed it here
            time.sleep(UVICORN_DEFAULT_KEEP_ALIVE_S + 0.5)
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")


@pytest.mark.integration
def test_the_server_calls_a_requests_disconnect_hooks_only_when_its_client_leaves_first() -> None:
    """The proxy's HTTP protocol calls back a request's disconnect hooks (no task per call to
    wait on receive() for http.disconnect): for a request whose client hung up mid-answer, and
    never for one it answered, on the same connection before."""
    import threading

    from dressage.proxy.serving import DISCONNECT_HOOKS
    from dressage.proxy.testing import serve_app

    called: list[str] = []
    started, release = threading.Event(), threading.Event()

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        if scope["type"] != "http":
            return
        hooks = scope["extensions"][DISCONNECT_HOOKS]
        path = scope["path"]
        hooks.append(lambda: called.append(path))
        if path == "/hold":
            started.set()
            while not called:  # held until the client has left
                await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]
        release.set()

    with serve_app(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /quick HTTP/1.1\r\nhost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n")
            assert started.wait(10)
        assert release.wait(10), "the held request was never told its client left"
    assert called == ["/hold"]


@pytest.mark.unit
def test_a_gone_signal_runs_its_callbacks_once_and_forgets_removed_ones() -> None:
    from dressage.proxy.generation_controller import GoneSignal

    async def run() -> list[str]:
        seen: list[str] = []
        gone = GoneSignal()
        gone.on_set(lambda: seen.append("a"))
        remove = gone.on_set(lambda: seen.append("removed"))
        remove()
        gone.set()
        gone.set()  # a second set runs nothing again
        gone.on_set(lambda: seen.append("late"))  # already set: at once
        await asyncio.wait_for(gone.wait(), 1)
        return seen

    assert asyncio.run(run()) == ["a", "late"]


@pytest.mark.unit
def test_the_proxy_imports_no_polars_pandera_nor_pyarrow() -> None:
    """A proxy host needs none of them to serve: the store's Arrow tables are an export's, and
    dressage.schemas imports its pandera side only when a check names it."""
    import subprocess
    import sys

    code = (
        "import sys, dressage.proxy.server; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'polars', 'pandera', 'pyarrow'})); "
        "import dressage.schemas; "
        "dressage.schemas.validate_table; "
        "print('pandera' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split("\n")
    assert out[:2] == ["[]", "True"], out


class _RecordingTransport(asyncio.Transport):
    """The socket's side of uvicorn's protocol: what it writes, in order, and when it closes."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[bytes | str] = []
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closing, "written after close"
        self.events.append(bytes(data))

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 8)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _exchange(request: bytes, app: object) -> list[bytes | str]:
    """Feed ``request`` to the proxy's HTTP protocol (uvicorn's, real) and return its writes."""
    from uvicorn.server import ServerState

    from dressage.proxy.serving import uvicorn_config

    async def run() -> list[bytes | str]:
        config = uvicorn_config(app, lifespan="off")
        config.load()
        loop = asyncio.get_running_loop()
        protocol = config.http_protocol_class(
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        )
        transport = _RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        for _ in range(200):
            await asyncio.sleep(0.005)
            if protocol.cycle is not None and protocol.cycle.response_complete:
                break
        await asyncio.sleep(0.01)
        events = list(transport.events)
        protocol.connection_lost(None)  # the client leaves (uvicorn closes its side then)
        return events

    return asyncio.run(run())


async def _sized_app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    body = b'{"ok":true}'
    if scope["method"] == "POST":
        body = (await receive())["body"]  # type: ignore[operator]
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": body})  # type: ignore[operator]


async def _streamed_app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    for part in (b"data: 1\n\n", b"data: 2\n\n"):
        await send({"type": "http.response.body", "body": part, "more_body": True})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]


@pytest.mark.unit
def test_a_whole_answer_leaves_in_one_write_and_a_stream_as_it_comes() -> None:
    get = b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n"
    (one,) = _exchange(get, _sized_app)
    assert isinstance(one, bytes) and one.startswith(b"HTTP/1.1 200 OK\r\n")
    assert one.endswith(b'\r\n\r\n{"ok":true}')
    # the client asks to close: the answer is written whole before the close
    events = _exchange(get.replace(b"host: x", b"host: x\r\nconnection: close"), _sized_app)
    assert len(events) == 2 and events[1] == "close" and b'{"ok":true}' in events[0]
    # a HEAD gets its head (uvicorn writes no body for it)
    (head,) = _exchange(get.replace(b"GET", b"HEAD"), _sized_app)
    assert isinstance(head, bytes) and head.endswith(b"\r\n\r\n") and b"ok" not in head
    # Expect: 100-continue: the interim answer goes out before the body is read, on its own
    post = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\nhi"
    interim, answer = _exchange(post, _sized_app)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert isinstance(answer, bytes) and answer.endswith(b"\r\n\r\nhi")
    # a stream: the head first, then each part as it is sent
    events = _exchange(get, _streamed_app)
    assert [e[:15] for e in events if isinstance(e, bytes)][0] == b"HTTP/1.1 200 OK"
    assert b"data: 1" not in events[0] and len(events) == 4  # head, 2 parts, the last chunk


@pytest.mark.unit
def test_the_one_write_send_leaves_no_reference_cycle() -> None:
    """uvicorn's cycle holds the send that replaces its own: were the send to hold the cycle
    back, every request would leave a cycle for the collector. With the collector off, the
    cycle is freed as soon as its last reference goes."""
    import gc
    import weakref

    from dressage.proxy.serving import _one_write

    class Cycle:  # the two attributes of uvicorn's RequestResponseCycle that the send uses
        transport = _RecordingTransport()

        async def send(self, message: object) -> None:
            pass

    cycle = Cycle()
    cycle.send = _one_write(cycle)  # type: ignore[method-assign]
    ref = weakref.ref(cycle)
    gc.disable()
    try:
        del cycle
        assert ref() is None, "the one-write send holds its cycle in a reference cycle"
    finally:
        gc.enable()
