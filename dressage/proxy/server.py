"""``dressage-proxy``: the recording proxy's HTTP app and entry point.

    dressage-proxy --engine-url http://127.0.0.1:30000 --store-dir ./proxy-store \\
        [--host 127.0.0.1] [--port 8000] [--admin-key K] [--api-key K] [--tito-model qwen3.5]

An agent points its OpenAI base URL at ``http://HOST:PORT/sessions/<session_id>/v1`` (or sends
``X-Session-Id: <session_id>`` to ``/v1``). Routes:

    POST /v1/chat/completions, /sessions/{id}/v1/chat/completions   chat (API key when set)
    GET  /v1/models, /sessions/{id}/v1/models                       (API key when set)
    GET  /v1/capabilities                                           (API key when set)
    POST /v1/sessions/{id}/open  {"partial_rollout"} -> {"session_id", "status", ...}    (admin)
    POST /v1/sessions/{id}/finalize     -> {"session_id", "segments": [Segment dicts]}  (admin)
    POST /v1/sessions/{id}/discard      -> {"session_id", "discarded": true, "steps"}    (admin)
    GET  /v1/sessions/{id}/trajectory   -> {"status", "steps", "segments", "damage"}     (admin)
    GET  /v1/sessions/{id}/stats, GET /v1/stats                                          (admin)
    POST /v1/rollout/pause   {"reason", "mode", "timeout_seconds"} -> the pause report    (admin)
    POST /v1/rollout/resume  {"version", "reason"}                -> the resume report   (admin)
    GET  /v1/rollout/pause_state                                                         (admin)
    GET  /health   {"status": "ok"}: the proxy serves (liveness)                         (open)
    GET  /ready    200 when the engine answers its /health, else 503 saying what is down  (open)

Rollout pause and resume (around weight updates), and partial rollout asked per call (the
``X-Dressage-Partial-Rollout`` header, ``open``'s ``partial_rollout``): the pause contract in
:mod:`~dressage.proxy.pause_controller`.

With ``--access-log`` every request gets one line on the ``dressage.proxy.access`` logger
(method, route, session, status, milliseconds, the refused field of a 4xx;
:mod:`~dressage.proxy.access_log`); it is off by default (about 3% of a call's CPU).

The proxy checks its tokenizer against the engine's vocabulary once the engine answers, and
refuses to start (exit status 2, the reason on stderr) when the engine serves another one,
whether it answered at start or only later (:mod:`~dressage.proxy.vocabulary`).

With ``--workers N`` (N > 1) :func:`main` runs :mod:`~dressage.proxy.front` instead: one port,
N processes of this app behind it, each session in one of them (its calls, its store).

Keys travel as ``Authorization: Bearer <key>`` (the OpenAI SDK sends its api_key so); the admin
key is also accepted where the API key is. Bodies over ``--max-request-bytes`` get 413; bad
bodies a JSON 400 naming the field (:mod:`~dressage.proxy.http_io`). Once the proxy accepts
connections it prints ``DRESSAGE_PROXY_URL=http://HOST:PORT`` and logs one info line on stderr
naming that URL and the engine's (:data:`READY_LOGGER`); uvicorn's settings are in
:mod:`~dressage.proxy.serving`. Routes are thin: the chat routes are in
:mod:`~dressage.proxy.chat_routes`, the work in :mod:`~dressage.proxy.sessions`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from dressage.auth import key_matches
from dressage.config.proxy import ProxyConfig, ProxyConfigError, config_from_argv, parser
from dressage.proxy.access_log import ACCESS_LOGGER, AccessLog, note_refusal
from dressage.proxy.chat_routes import (
    SESSION_HEADERS,
    ChatEndpoint,
    add_chat_routes,
    chat_route_session,
)
from dressage.proxy.client import PARTIAL_ROLLOUT_HEADER
from dressage.proxy.client_limits import RefusalThrottle
from dressage.proxy.encoding import install_encode_memo
from dressage.proxy.engine_answers import EngineError
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.errors import ProxyError, Unauthorized
from dressage.proxy.generation_controller import GenerationController
from dressage.proxy.http_io import as_proxy_error, json_response, read_optional_json
from dressage.proxy.openai_schema import add_chat_to_openapi
from dressage.proxy.pause_controller import PauseController
from dressage.proxy.pause_requests import parse_pause_request, parse_resume_request
from dressage.proxy.serving import uvicorn_config
from dressage.proxy.sessions import SessionManager, parse_open_request
from dressage.proxy.store import StoreError, TrajectoryStore
from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer
from dressage.proxy.workers import store_layout_error

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "READY_LOGGER",
    "READY_PREFIX",
    "SESSION_HEADERS",
    "ProxyApp",
    "create_app",
    "error_response",
    "load_proxy_tokenizer",
    "main",
]

log = logging.getLogger(__name__)
READY_PREFIX = "DRESSAGE_PROXY_URL="
READY_LOGGER = "dressage.proxy.ready"
"""The logger of the one info line (on stderr) that says the proxy serves, where, and in front of
which engine."""
VERSION = "dressage-proxy-0.1"
_json = json_response


class _GCTimes:
    """This process's cyclic-GC collections, their time and what they freed (``/v1/stats``'s
    ``gc``): a collection pauses every call on the loop, and a profiler that samples charges it
    to whatever allocation started it. Timed from :data:`gc.callbacks`, once per process."""

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self.unreachable = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._started
            self.unreachable += info["collected"]

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def report(self) -> dict[str, Any]:
        return {
            "collections": self.collections,
            "seconds": round(self.seconds, 4),
            "unreachable_objects": self.unreachable,
        }


GC_TIMES = _GCTimes()


def load_proxy_tokenizer(config: ProxyConfig) -> PreTrainedTokenizerBase:
    """``--tokenizer-path``, else the project's own tokenizer of the TITO family."""
    from dressage.assets import load_family_tokenizer, load_tokenizer

    if config.tokenizer_path:
        return load_tokenizer(config.tokenizer_path)
    if config.tito_model in ("llama3", "deepseek"):
        return load_family_tokenizer(config.tito_model)
    return load_tokenizer("qwen3" if config.tito_model == "qwen3" else "qwen3.5")


class _Auth:
    def __init__(self, config: ProxyConfig) -> None:
        admin = (config.admin_key,) if config.admin_key else ()
        self.admin_keys: tuple[str, ...] = admin
        self.chat_keys: tuple[str, ...] = (config.api_key, *admin) if config.api_key else ()

    @staticmethod
    def _check(request: Request, keys: tuple[str, ...], what: str) -> None:
        if not keys:
            return
        if not key_matches(request.headers.get("authorization"), keys):
            raise Unauthorized(f"{what} needs a valid 'Authorization: Bearer <key>' header")

    def chat(self, request: Request) -> None:
        self._check(request, self.chat_keys, "this endpoint")

    def admin(self, request: Request) -> None:
        self._check(request, self.admin_keys, "session and control endpoints")


def create_app(
    config: ProxyConfig,
    *,
    engine: EngineClient | None = None,
    store: TrajectoryStore | None = None,
    tito: TITOTokenizer | None = None,
    controller: GenerationController | None = None,
    on_vocabulary_mismatch: Callable[[str], None] | None = None,
) -> FastAPI:
    """The proxy app. What is not given is built from ``config`` (and closed with the app).

    At start the app checks its tokenizer against the engine's vocabulary, at once if the engine
    answers, else once it does (:mod:`~dressage.proxy.vocabulary`); ``on_vocabulary_mismatch``
    gets the refusal's sentence (``dressage-proxy`` stops on it)."""
    owned: list[Any] = []
    if tito is None:
        tito = create_tito_tokenizer(
            load_proxy_tokenizer(config), config.tito_model, build_mode=config.token_build_mode
        )
    if engine is None:
        engine = EngineClient(
            config.engine_url_clean,
            api_key=config.engine_api_key,
            admin_key=config.engine_admin_key,
            timeout=config.engine_timeout_s,
            retries=config.engine_retries,
            stream_coalesce=config.stream_coalesce_ms / 1000,
        )
        owned.append(engine)
    if store is None:
        store = TrajectoryStore.open(config.store_dir, fsync=config.store_fsync)
        owned.append(store)
    install_encode_memo(tito)
    if controller is not None and isinstance(controller.gate, PauseController):
        pause = controller.gate
    else:  # a given controller without a pause gate: the routes answer, nothing is held
        pause = PauseController(
            engine,
            keep_partial=config.partial_rollout,
            max_pauses_per_trajectory=config.max_pauses_per_trajectory,
            default_timeout_s=config.pause_timeout_s,
        )
    controller = controller or GenerationController(engine, resume_policy=pause, gate=pause)
    manager = SessionManager(tito, controller, store, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager.limits.scan()  # the longest token, off the loop, before calls need it
        vocabulary = manager.vocabulary
        await vocabulary.first_look()
        watching = None
        if not vocabulary.decided:  # the engine is not up yet: decide once it answers
            watching = asyncio.create_task(vocabulary.watch(on_vocabulary_mismatch))
        elif vocabulary.refusal and on_vocabulary_mismatch is not None:
            on_vocabulary_mismatch(vocabulary.refusal)
        yield
        if watching is not None:
            watching.cancel()
        await pause.close()
        for resource in owned:
            if isinstance(resource, EngineClient):
                await resource.aclose()
            else:
                resource.close()

    app = ProxyApp(title="dressage proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.manager = manager
    app.state.pause = pause
    app.state.started = time.time()
    GC_TIMES.install()

    @app.exception_handler(ProxyError)
    @app.exception_handler(EngineError)
    @app.exception_handler(StoreError)
    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:
        return error_response(request, exc)

    auth = _Auth(config)
    chat = ChatEndpoint(manager, config, check_key=auth.chat, error_response=error_response)
    routes = add_chat_routes(app, chat)
    _add_info(app, engine, auth, config)
    _add_sessions(app, manager, auth, config)
    _add_rollout_control(app, pause, auth, config)
    add_chat_to_openapi(app)
    app.serve_chat(chat, routes)
    if config.client_refusal_rate > 0:
        app.wrap(lambda inner: RefusalThrottle(
            inner, rate=config.client_refusal_rate, burst=config.client_refusal_burst
        ))  # fmt: skip
    if config.access_log:  # outside the throttle: its 429s are logged too
        app.wrap(AccessLog)
    return app


def error_response(request: Request, exc: Exception) -> Response:
    """The answer to a request that failed with ``exc``: the error body and status a client
    sees (engine addresses scrubbed), logged when it is the proxy's fault (5xx), named on the
    request's access line when it is a refusal."""
    error = as_proxy_error(exc)
    if not isinstance(exc, ProxyError | EngineError | StoreError):
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _json(error.body(), 500)
    if error.status >= 500:
        log.error("%s %s -> %d: %s", request.method, request.url.path, error.status, exc)
    note_refusal(request.scope, error.param, error.code)
    return _json(error.body(), error.status)


class ProxyApp(FastAPI):
    """The proxy's FastAPI app, with its per-request middleware (the refusal throttle, the
    access log) outside it and the chat routes served before its own stack.

    A chat call is most of what the proxy serves, and Starlette's stack (its error and
    exception middleware, FastAPI's exit stack, the router's match over every route) cost
    about a twentieth of a call's CPU. :meth:`serve_chat` sends ``POST`` to either chat path
    straight to the :class:`~dressage.proxy.chat_routes.ChatEndpoint` (which answers its own
    errors as the exception handlers do), after the same middleware as any other request; the
    router holds the same endpoint for anything else that reaches it (another method: 405)."""

    _chat: ASGIApp | None = None
    _chat_routes: tuple[Route, Route] | None = None
    _front: ASGIApp | None = None

    def serve_chat(self, endpoint: ASGIApp, routes: tuple[Route, Route]) -> None:
        """Serve the chat routes ``routes`` (by header, by path) with ``endpoint`` first."""
        self._chat, self._chat_routes = endpoint, routes

    def wrap(self, middleware: Callable[[ASGIApp], ASGIApp]) -> None:
        """Put ``middleware`` around every HTTP request (the last one wrapped is outermost)."""
        self._front = middleware(self._front or self._dispatch)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._chat is not None and scope["method"] == "POST" and not scope.get("root_path"):
            session_id = chat_route_session(scope["path"])
            if session_id is not None and self._chat_routes is not None:
                scope["path_params"] = {"session_id": session_id} if session_id else {}
                scope["route"] = self._chat_routes[1 if session_id else 0]  # for the access log
                await self._chat(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await super().__call__(scope, receive, send)
        else:
            await (self._front or self._dispatch)(scope, receive, send)


def _add_info(app: FastAPI, engine: EngineClient, auth: _Auth, config: ProxyConfig) -> None:
    def models_body() -> dict[str, Any]:
        card = {
            "id": config.served_model_name,
            "object": "model",
            "created": int(app.state.started),
            "owned_by": "dressage",
        }
        return {"object": "list", "data": [card]}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        auth.chat(request)
        return _json(models_body())

    @app.get("/sessions/{session_id}/v1/models")
    async def session_models(request: Request, session_id: str) -> Response:
        auth.chat(request)
        return _json(models_body())

    @app.get("/v1/capabilities")
    async def capabilities(request: Request) -> Response:
        auth.chat(request)
        return _json(
            {
                "version": VERSION,
                "model": config.served_model_name,
                **config.segment_flags(),
                "streaming": True,
                "tools": True,
                "reasoning": True,
                "session_headers": ["X-Session-Id", "X-Dressage-Session-Id"],
                "session_base_path": "/sessions/{session_id}/v1",
                "pause_resume": True,
                "partial_rollout_header": PARTIAL_ROLLOUT_HEADER,
                "store_fsync": config.store_fsync,
                "max_request_bytes": config.max_request_bytes,
                "default_max_tokens": config.default_max_tokens,
            }
        )

    @app.get("/health")
    async def health() -> Response:
        """Liveness: the proxy serves. Whether it can generate is ``/ready``."""
        return _json({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 503 naming what is down (never where the engine runs)."""
        refusal = app.state.manager.vocabulary.refusal
        if refusal:
            return _json({"status": "not_ready", "engine": refusal}, 503)
        if await engine.healthy():
            return _json({"status": "ready", "engine": "ok"})
        return _json({"status": "not_ready", "engine": "unreachable or unhealthy"}, 503)


def _add_sessions(app: FastAPI, manager: SessionManager, auth: _Auth, config: ProxyConfig) -> None:
    @app.post("/v1/sessions/{session_id}/open")
    async def open_session(request: Request, session_id: str) -> Response:
        auth.admin(request)
        body = await read_optional_json(request, config.max_request_bytes)
        partial_rollout = parse_open_request(body)
        return _json(await manager.open_session(session_id, partial_rollout=partial_rollout))

    @app.post("/v1/sessions/{session_id}/finalize")
    async def finalize(request: Request, session_id: str) -> Response:
        auth.admin(request)
        segments = await manager.finalize(session_id)
        return _json({"session_id": session_id, "segments": [s.to_dict() for s in segments]})

    @app.post("/v1/sessions/{session_id}/discard")
    async def discard(request: Request, session_id: str) -> Response:
        auth.admin(request)
        steps = await manager.discard(session_id)
        return _json({"session_id": session_id, "discarded": True, "steps": steps})

    @app.get("/v1/sessions/{session_id}/trajectory")
    async def trajectory(request: Request, session_id: str) -> Response:
        auth.admin(request)
        return _json(manager.trajectory(session_id))

    @app.get("/v1/sessions/{session_id}/stats")
    async def session_stats(request: Request, session_id: str) -> Response:
        auth.admin(request)
        return _json(manager.session_stats(session_id))

    @app.get("/v1/stats")
    async def stats(request: Request) -> Response:
        auth.admin(request)
        store = manager.store
        return _json(
            {
                **manager.stats(),
                "engine_url": config.engine_url_clean,
                "store": {
                    "path": str(store.path),
                    "bytes": store.size_bytes,
                    "fsync": store.fsync,
                    "replayed_records": store.report.records,
                    "skipped_corrupt": store.report.skipped_corrupt,
                    "torn_tail_bytes": store.report.torn_tail_bytes,
                    "unattributed": store.report.unattributed,
                    "damaged_sessions": store.damaged_sessions,
                },
                "uptime_s": round(time.time() - app.state.started, 3),
                "rss_bytes": _rss_bytes(),
                "gc": GC_TIMES.report(),
            }
        )


def _add_rollout_control(
    app: FastAPI, pause: PauseController, auth: _Auth, config: ProxyConfig
) -> None:
    async def body(request: Request) -> Any:
        return await read_optional_json(request, config.max_request_bytes)

    @app.post("/v1/rollout/pause")
    async def pause_rollout(request: Request) -> Response:
        auth.admin(request)
        parsed = parse_pause_request(await body(request), default_timeout_s=pause.default_timeout_s)
        return _json(await pause.pause(parsed))

    @app.post("/v1/rollout/resume")
    async def resume_rollout(request: Request) -> Response:
        auth.admin(request)
        return _json(await pause.resume(parse_resume_request(await body(request))))

    @app.get("/v1/rollout/pause_state")
    async def pause_state(request: Request) -> Response:
        auth.admin(request)
        return _json(pause.state())


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def tune_gc() -> None:
    """Keep the cyclic GC off the hot path: the tokenizer import leaves ~10^6 long-lived objects
    (transformers, torch) that every full collection would walk; freeze them, and collect the
    young generation less often (a call allocates thousands of short-lived, acyclic objects).
    Measured in bench/proxy.py: about 2x the calls/s of the defaults."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def main(argv: Sequence[str] | None = None, *, worker_index: int | None = None) -> int:
    """Entry point of ``dressage-proxy`` (see the module docstring); ``worker_index``: this
    process is that worker of a ``--workers N`` front (:mod:`~dressage.proxy.workers`)."""
    import uvicorn

    flags = list(sys.argv[1:] if argv is None else argv)
    prog = parser().prog  # how it was started: dressage-proxy, dressage proxy serve
    try:
        config, log_level = config_from_argv(flags)
    except ProxyConfigError as exc:  # one sentence a problem, naming its flag or variable
        for sentence in exc.sentences:
            print(f"{prog}: {sentence}", file=sys.stderr)
        return 2
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if config.access_log:  # --access-log: at INFO, whatever --log-level says of the rest
        logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)
    ready_log = logging.getLogger(READY_LOGGER)
    ready_log.setLevel(logging.INFO)  # said whatever --log-level says of the rest
    if config.workers > 1:
        from dressage.proxy.front import serve_front

        return serve_front(config, flags, ready_log)
    if worker_index is None and (refusal := store_layout_error(config.store_dir, 1)):
        print(f"{prog}: {refusal}", file=sys.stderr)
        return 2
    what = "proxy" if worker_index is None else f"proxy worker {worker_index}"
    refusals: list[str] = []

    def refuse(sentence: str) -> None:  # the engine serves another vocabulary: stop, say why
        print(f"{prog}: {sentence}", file=sys.stderr, flush=True)
        refusals.append(sentence)
        server.should_exit = True

    app = create_app(config, on_vocabulary_mismatch=refuse)
    tune_gc()
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:  # the socket listens: /health answers now
                print(f"{READY_PREFIX}http://{host}:{port}", flush=True)
                ready_log.info(
                    "dressage %s ready at http://%s:%d, in front of the engine at %s "
                    "(store %s)",
                    what, host, port, config.engine_url_clean, config.store_dir,
                )  # fmt: skip

    server = _Server(uvicorn_config(app, log_level=log_level))
    server.run(sockets=[sock])
    return 2 if refusals else 0


if __name__ == "__main__":
    sys.exit(main())
