"""Serve the proxy for a test or a script, and a scripted engine for what a real one cannot do.

    from dressage.proxy.testing import serve_proxy, ScriptedEngine
    with serve_proxy(config, tito=tito) as url:               # uvicorn on a thread, free port
        OpenAI(base_url=f"{url}/sessions/s1/v1", api_key="x")

:class:`ScriptedEngine` answers SGLang's ``/generate`` (plain and streamed: cumulative chunks, or
incremental ones as SGLang's ``--incremental-streaming-output`` sends them) with output ids a script
chooses, at once. It exists for three things the real engine cannot give: outputs a random tiny
model never writes (tool calls, malformed tool calls, aborts at a chosen token), a router's
behaviour (``GET /workers``, the 404 on ``/abort_request``, its 503 error body), and an engine that
costs nothing, so that the proxy benchmark measures only the proxy. A reply with ``hold=True`` is a
generation that runs until it is aborted: the engine sends its first token (streamed), then waits
for ``/abort_request`` naming its rid and answers with all its ids and finish ``abort``, as SGLang
does. ``context_length`` makes it answer ``/server_info`` with that context. It is a raw asyncio
server (no framework) for the cost::

    python -m dressage.proxy.testing --port 0 --output-file ids.json   # prints its URL
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dressage.commands import command_parser
from dressage.config.proxy import ProxyConfig
from dressage.health import wait_healthy
from dressage.serve_thread import serve_on_thread

_COUNT = re.compile(rb'"completion_tokens": (\d+)')

__all__ = ["EngineReply", "ScriptedEngine", "serve_app", "serve_proxy", "sglang_refusal"]


@dataclass
class EngineReply:
    """What the scripted engine answers to one ``/generate``."""

    output_ids: list[int]
    finish: str = "stop"
    """``stop`` (matched = last id), ``length`` or ``abort``."""
    status_code: int | None = None
    """For ``abort``: an error status (SGLang turns it into an HTTP error)."""
    http_status: int = 200
    error_body: dict[str, Any] | None = None
    """Answer with this body and ``http_status`` instead of an output."""
    hold: bool = False
    """Generate until aborted (see the module docstring); ``finish`` is then ``abort``."""


Script = Callable[[dict[str, Any]], EngineReply]


def sglang_refusal(sampling: dict[str, Any]) -> str | None:
    """The 400 SGLang answers before generating, for the two rules of ``SamplingParams.verify``
    the proxy's router probe relies on (docs/sglang.md section 1.2): more than one grammar, and
    a ``logit_bias`` id that is not a token id; None for anything else."""
    grammars = [k for k in ("json_schema", "regex", "ebnf", "structural_tag") if sampling.get(k)]
    if len(grammars) > 1:
        return "Only one of json_schema, regex, ebnf, or structural_tag can be set."
    bad = [k for k in sampling.get("logit_bias") or {} if not str(k).isdigit()]
    if bad:
        return f"logit_bias key {bad[0]!r} is not a token id in the vocabulary."
    return None


@dataclass
class _Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ScriptedEngine:
    """A scripted SGLang server (see the module docstring). ``script(body) -> EngineReply``;
    ``workers``: answer ``GET /workers`` with these URLs and refuse control routes like a router
    (None: a plain server, 404 on ``/workers``)."""

    script: Script
    weight_version: str = "default"
    workers: list[str] | None = None
    logprob: float = -0.25
    record: bool = True
    context_length: int | None = None
    stream_interval_s: float | None = None
    """None: every answer at once, a streamed one in one write; a number: the seconds a token
    takes to decode. A streamed answer is then sent chunked, an HTTP chunk per event, each
    event when its tokens are decoded (the first at once), as SGLang sends a token at each
    decode step, and a whole answer when its last token is, so that a call takes as long
    streamed or not."""
    incremental: bool = False
    """Stream as an engine run with ``--incremental-streaming-output``: each chunk's ids and
    per-token log-probs are only its new ones (its ``completion_tokens`` stays cumulative), and
    ``/server_info`` says so."""
    seen: list[_Seen] = field(default_factory=list)
    url: str = ""
    held: threading.Event = field(default_factory=threading.Event)
    """Set when a ``hold`` generation has started (its first token is out, if streamed)."""
    aborted: list[str] = field(default_factory=list)
    """rids of the held generations that ``/abort_request`` ended."""
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _holding: dict[str, asyncio.Event] = field(default_factory=dict)

    def _generate(
        self, body: dict[str, Any], reply: EngineReply | None = None
    ) -> tuple[int, bytes, bool]:
        reply = reply or self.script(body)
        if reply.error_body is not None:
            return reply.http_status, json.dumps(reply.error_body).encode(), False
        params = body.get("sampling_params") or {}
        ids = list(reply.output_ids)
        finish: dict[str, Any]
        budget = params.get("max_new_tokens")
        if isinstance(budget, int) and len(ids) > budget:
            ids, finish = ids[:budget], {"type": "length", "length": budget}
        elif reply.finish == "stop":
            finish = {"type": "stop", "matched": ids[-1] if ids else 0}
        elif reply.finish == "length":
            finish = {"type": "length", "length": len(ids)}
        else:
            finish = {"type": "abort", "message": "Aborted", "status_code": reply.status_code}
        prompt = body.get("input_ids") or []
        return 200, self._output(body, ids, finish, len(prompt)), bool(body.get("stream"))

    def _output(self, body: dict[str, Any], ids: list[int], finish: Any, prompt: int) -> bytes:
        meta = {
            "id": body.get("rid", ""),
            "finish_reason": finish,
            "prompt_tokens": prompt,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "output_token_logprobs": [[self.logprob, i, None] for i in ids],
        }
        return json.dumps({"text": "", "output_ids": ids, "meta_info": meta}).encode()

    def _stream_body(self, body: dict[str, Any], final: bytes) -> bytes:
        """SSE chunks, one per ``sampling_params.stream_interval`` tokens (1 if not given), the
        last one carrying the finish reason: cumulative, or each with only its new tokens
        (:attr:`incremental`)."""
        data = json.loads(final)
        ids, meta = data["output_ids"], data["meta_info"]
        interval = (body.get("sampling_params") or {}).get("stream_interval") or 1
        events = []
        cuts = [*range(interval, len(ids), interval), len(ids)]
        for start, k in zip([0, *cuts], cuts, strict=False):
            first = start if self.incremental else 0
            partial = dict(meta, completion_tokens=k)
            if k < len(ids):
                partial["finish_reason"] = None
            partial["output_token_logprobs"] = meta["output_token_logprobs"][first:k]
            events.append({"text": "", "output_ids": ids[first:k], "meta_info": partial})
        out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        return out + b"data: [DONE]\n\n"

    def handle(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        reply: EngineReply | None = None,
    ) -> tuple[int, bytes, str]:
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return 400, b'{"error": {"message": "not JSON"}}', "application/json"
        if self.record and path != "/health":
            self.seen.append(_Seen(path, headers, body))
        if path == "/generate":
            status, payload, stream = self._generate(body, reply)
            if stream and status == 200:
                return 200, self._stream_body(body, payload), "text/event-stream"
            return status, payload, "application/json"
        if path == "/workers" and self.workers is not None:
            items = [
                {"id": f"w{i}", "url": u, "is_healthy": True} for i, u in enumerate(self.workers)
            ]
            return (
                200,
                json.dumps({"workers": items, "total": len(items)}).encode(),
                "application/json",
            )
        if path in ("/abort_request", "/pause_generation", "/continue_generation"):
            if self.workers is not None:  # routers have no control routes
                return 404, b"Not Found", "text/plain"
            if path == "/abort_request" and isinstance(body, dict):
                prefix = str(body.get("rid") or "")
                for rid, event in self._holding.items():
                    if body.get("abort_all") or (prefix and rid.startswith(prefix)):
                        event.set()
            return 200, b"", "application/json"
        if path in ("/server_info", "/get_server_info") and self.context_length is not None:
            limits: dict[str, Any] = {"context_length": self.context_length}
            limits["max_req_input_len"] = self.context_length - 1
            limits["incremental_streaming_output"] = self.incremental
            return 200, json.dumps(limits).encode(), "application/json"
        if path in ("/model_info", "/get_model_info"):
            info = {"model_path": "scripted", "weight_version": self.weight_version}
            return 200, json.dumps(info).encode(), "application/json"
        if path == "/health":
            return 200, b"", "application/json"
        return 404, b'{"detail": "Not Found"}', "application/json"

    # ------------------------------------------------------------------------------ serving
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                route = path.split("?")[0]
                reply = self._script_generate(route, raw)
                if reply is not None and reply.hold:
                    await self._hold(json.loads(raw), reply, writer)
                    return
                status, payload, kind = self.handle(method, route, headers, raw, reply)
                if kind == "text/event-stream" and self.stream_interval_s is not None:
                    await self._paced(payload, writer)
                    continue
                count = _COUNT.search(payload) if route == "/generate" else None
                if count is not None and status == 200 and self.stream_interval_s is not None:
                    await asyncio.sleep(self.stream_interval_s * (int(count.group(1)) - 1))
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
                    % (status, kind.encode(), len(payload))
                    + payload
                )
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _paced(self, events: bytes, writer: asyncio.StreamWriter) -> None:
        """A streamed answer as SGLang sends it: chunked, an event a chunk, each when its
        tokens are decoded; ``[DONE]`` and the body's end right after the last."""
        assert self.stream_interval_s is not None
        writer.write(b"HTTP/1.1 200 X\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        sent = 0  # tokens sent so far
        for event in events.split(b"\n\n")[:-1]:
            count = _COUNT.search(event)
            if count is not None:  # not [DONE]
                tokens = int(count.group(1))
                if sent:
                    await asyncio.sleep(self.stream_interval_s * (tokens - sent))
                sent = tokens
            writer.write(b"%x\r\n%s\n\n\r\n" % (len(event) + 2, event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    def _script_generate(self, route: str, raw: bytes) -> EngineReply | None:
        """The script's reply to a ``/generate`` body (None for anything else)."""
        if route != "/generate":
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        refusal = sglang_refusal(body.get("sampling_params") or {})
        if refusal is not None:
            return EngineReply([], http_status=400, error_body={"error": refusal})
        return self.script(body)

    async def _hold(
        self, body: dict[str, Any], reply: EngineReply, writer: asyncio.StreamWriter
    ) -> None:
        """Serve a ``hold`` reply (module docstring) on this connection; the caller closes it."""
        if self.record:
            self.seen.append(_Seen("/generate", {}, body))
        rid = str(body.get("rid", ""))
        self._holding[rid] = aborted = asyncio.Event()
        stream = bool(body.get("stream"))
        reply = EngineReply(reply.output_ids, finish="abort")
        _, final, _ = self._generate(body, reply)
        try:
            if stream:  # the head and the first token now, the rest once aborted
                events = self._stream_body(body, final).split(b"\n\n")
                writer.write(b"HTTP/1.1 200 X\r\ncontent-type: text/event-stream\r\n")
                writer.write(b"connection: close\r\n\r\n" + events[0] + b"\n\n")
                await writer.drain()
            self.held.set()
            await aborted.wait()
            self.aborted.append(rid)
            if stream:
                writer.write(b"\n\n".join(events[1:]))
            else:
                head = b"HTTP/1.1 200 X\r\ncontent-type: application/json\r\n"
                writer.write(head + b"content-length: %d\r\n\r\n" % len(final) + final)
            await writer.drain()
        finally:
            self._holding.pop(rid, None)

    async def serve(self, sock: socket.socket) -> None:
        # A deep backlog: hundreds of connections open at once (asyncio's default is 100, and a
        # dropped SYN costs a 1 s retransmit).
        server = await asyncio.start_server(self._connection, sock=sock, backlog=4096)
        async with server:
            await server.serve_forever()

    @contextmanager
    def running(self, port: int = 0) -> Iterator[str]:
        """Serve on a loopback port (0: a free one) in a background thread; yields the URL."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        loop = asyncio.new_event_loop()
        task: list[asyncio.Task[None]] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            task.append(loop.create_task(self.serve(sock)))
            try:
                loop.run_until_complete(task[0])
            except asyncio.CancelledError:
                pass

        thread = threading.Thread(target=run, name="scripted-engine", daemon=True)
        thread.start()
        try:
            wait_healthy(self.url, 10.0, name="the proxy", interval_s=0.02)
            yield self.url
        finally:

            def stop() -> None:  # like a process exit: open connections are closed too
                for writer in list(self._writers):
                    writer.close()
                task[0].cancel()

            loop.call_soon_threadsafe(stop)
            thread.join(timeout=10)
            sock.close()


@contextmanager
def serve_app(app: Any, *, startup_timeout: float = 30.0) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a background thread, on a free loopback port, with
    the proxy's settings (:mod:`~dressage.proxy.serving`)."""
    from dressage.proxy.serving import uvicorn_config

    with serve_on_thread(
        uvicorn_config(app, timeout_graceful_shutdown=2),
        name="the app",
        thread_name="dressage-proxy-http",
        startup_timeout=startup_timeout,
        interval_s=0.02,
    ) as url:
        yield url


@contextmanager
def serve_proxy(config: ProxyConfig, **components: Any) -> Iterator[str]:
    """``create_app(config, **components)`` served on a thread; yields its base URL."""
    from dressage.proxy.server import create_app

    with serve_app(create_app(config, **components)) as url:
        yield url


def main(argv: list[str] | None = None) -> int:
    """A scripted engine process that answers every ``/generate`` with the same ids."""
    p = command_parser("python -m dressage.proxy.testing", description=main.__doc__)
    p.add_argument("--port", type=int, default=0, help="port to serve on (0: a free one)")
    p.add_argument("--output-file", required=True, help="JSON list of output ids")
    p.add_argument("--stream-interval-ms", type=float, default=None,
                   help="decode a token every this many ms: streamed answers go chunked, "
                        "an event as its tokens are decoded, whole ones when the last is "
                        "(default: every answer at once)")  # fmt: skip
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream each chunk's new tokens only, as SGLang does with this flag "
                        "(default: cumulative chunks)")  # fmt: skip
    args = p.parse_args(argv)
    with open(args.output_file) as f:
        ids = [int(i) for i in json.load(f)]
    interval = None if args.stream_interval_ms is None else args.stream_interval_ms / 1000
    engine = ScriptedEngine(lambda body: EngineReply(ids), record=False,
                            stream_interval_s=interval,
                            incremental=args.incremental_streaming_output)  # fmt: skip
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"SCRIPTED_ENGINE_URL=http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(engine.serve(sock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
