"""FastAPI app of the embedded engine: SGLang's native HTTP API, thin routes over ``service.py``.

    app = create_app(EngineConfig(model_path="/path/to/model"))   # loads the model
    uvicorn.run(app, host="127.0.0.1", port=30000)

or ``dressage engine serve --model PATH``. Routes only parse bodies, call the service and shape
replies; request validation is in ``protocol.py``, the batching loop in ``scheduler.py``.

Keys (SGLang's rules, docs/sglang.md section 7.4; the settings in ``config.py``): ``/health*``,
``/ready*`` and ``/metrics*`` are always open. The data routes (:data:`DATA_ROUTES`: generation,
model and server info, loads) need the API key when one is set. Every other path is a control
route (pause and continue, abort, weight updates and versions, cache flush, and any route added
later) and needs the admin key, else the API key; a request without it gets 401 before its body
is read, so an unknown path and a bad body look the same to a caller without the key.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, Literal

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from dressage.auth import key_matches
from dressage.engine.config import EngineConfig
from dressage.engine.protocol import (
    BodyError,
    ContractError,
    RequestError,
    build_requests,
    generate_openapi,
    is_batch,
    output_json,
    parse_body,
)
from dressage.engine.request import Request as EngineRequest
from dressage.engine.scheduler import DuplicateRequestError, EngineStoppedError
from dressage.engine.service import EngineService, WeightUpdateError
from dressage.http_json import BodyTooLarge, JSONBodyError, parse_json_body, read_limited_body

VERSION = "dressage-engine-0.1"
DATA_ROUTES = frozenset({
    "/generate", "/model_info", "/get_model_info", "/server_info", "/get_server_info",
    "/v1/loads", "/get_load",
})  # fmt: skip
"""Routes that read or generate and change no state; every other route is a control route."""
_OPEN_PREFIXES = ("/health", "/ready", "/metrics")


# ------------------------------------------------------------------------------ error shapes
def _object_error(message: str, status: int = 400) -> JSONResponse:
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None}
    return JSONResponse(body | {"code": status}, status_code=status)


def _message_error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _too_large(exc: BodyTooLarge) -> str:
    size = "" if exc.declared is None else f" of {exc.declared} bytes"
    return f"request body{size} exceeds the limit of {exc.limit} bytes"


async def _read_json(request: Request, limit: int, *, empty_ok: bool = False) -> Any:
    raw = await read_limited_body(request, limit)
    if not raw.strip() and empty_ok:
        return {}
    try:  # also refuses nesting past 64 levels and lone surrogates (both were 500s)
        return parse_json_body(raw)
    except JSONBodyError as exc:
        raise BodyError(str(exc)) from None


# ------------------------------------------------------------------------------ control bodies
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AbortBody(_Strict):
    rid: StrictStr = ""
    abort_all: StrictBool = False
    finished_reason: Any = None  # accepted by SGLang for internal callers; unused here
    abort_message: Any = None


class PauseBody(_Strict):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueBody(_Strict):
    torch_empty_cache: StrictBool = True


class UpdateWeightsBody(_Strict):
    model_path: StrictStr
    load_format: StrictStr | None = None
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    flush_cache: StrictBool = True
    torch_empty_cache: StrictBool = False
    recapture_cuda_graph: StrictBool = False
    is_async: StrictBool = False
    keep_pause: StrictBool = False
    token_step: StrictInt = 0
    manifest: Any = None


class UpdateWeightVersionBody(_Strict):
    new_version: StrictStr
    abort_all_requests: StrictBool = True


# ------------------------------------------------------------------------------ auth
class _ApiKeyMiddleware:
    """The key rules of the module docstring, before any route runs."""

    def __init__(self, app: ASGIApp, api_key: str | None, control_key: str | None) -> None:
        self.app = app
        self.data_keys = (api_key,) if api_key else ()
        self.control_keys = (control_key,) if control_key else ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            keys = self.data_keys if path in DATA_ROUTES else self.control_keys
            if keys and not path.startswith(_OPEN_PREFIXES):
                header = Headers(scope=scope).get("authorization")
                if not key_matches(header, keys):
                    await JSONResponse({"error": "Unauthorized"}, status_code=401)(
                        scope, receive, send
                    )
                    return
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------ the app
def create_app(config: EngineConfig, *, on_ready: Callable[[], None] | None = None) -> FastAPI:
    """Load the model and build the app; the engine thread starts with the app's lifespan."""
    service = EngineService(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="dressage engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    _add_generate(app, service, config.max_body_bytes)
    _add_control(app, service, config.max_body_bytes)
    _add_info(app, service, config)
    app.add_middleware(_ApiKeyMiddleware, api_key=config.api_key, control_key=config.control_key)
    return app


def _add_generate(app: FastAPI, service: EngineService, limit: int) -> None:
    @app.api_route("/generate", methods=["POST", "PUT"], openapi_extra=generate_openapi())
    async def generate(request: Request) -> Response:
        try:
            body = parse_body(await _read_json(request, limit))
            reqs = build_requests(body, service.tokenizer, service.request_limits, service.grammars)
            batch = is_batch(body)
        except BodyTooLarge as exc:
            return _message_error(_too_large(exc), 413)
        except BodyError as exc:
            return _object_error(str(exc))
        except ContractError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except RequestError as exc:
            return _message_error(str(exc))
        shape = {
            "return_text_in_logprobs": body.return_text_in_logprobs,
            "return_prompt_token_ids": body.return_prompt_token_ids,
        }
        if body.stream:
            return StreamingResponse(
                _stream(service, reqs[0], shape), media_type="text/event-stream"
            )
        failure = await _run_all(service, reqs, request.is_disconnected)
        if isinstance(failure, DuplicateRequestError):
            return _message_error(str(failure))
        if failure is not None:
            return _object_error(str(failure), 503)
        outs = [
            output_json(r, service.tokenizer, final=True, weight_version=service.weight_version,
                        **shape)
            for r in reqs
        ]  # fmt: skip
        error = None if batch else _engine_error(reqs[0])
        if error is not None:
            return error
        return JSONResponse(outs if batch else outs[0])


async def _run_all(
    service: EngineService,
    reqs: list[EngineRequest],
    is_disconnected: Callable[[], Awaitable[bool]],
) -> Exception | None:
    """Run a batch to the end; on a refused submission, abort the rest and return the error."""
    lock = asyncio.Lock()

    async def disconnected() -> bool:  # one receive() at a time on the shared connection
        async with lock:
            return await is_disconnected()

    tasks = [asyncio.create_task(service.run_to_end(r, disconnected)) for r in reqs]
    try:
        await asyncio.gather(*tasks)
    except (DuplicateRequestError, EngineStoppedError) as exc:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return exc
    return None


def _engine_error(req: EngineRequest) -> JSONResponse | None:
    """An abort that carries a status code (engine failure, shutdown) is an HTTP error."""
    finish = req.finish
    if finish is None or finish.type != "abort" or finish.status_code is None:
        return None
    if finish.status_code == 400:
        return _message_error(finish.message or "")
    return _object_error(finish.message or "", finish.status_code)


async def _stream(
    service: EngineService, req: EngineRequest, shape: dict[str, bool]
) -> AsyncIterator[str]:
    sent = 0
    try:
        async for r in service.generate(req):
            n = len(r.output_ids)
            if not r.finished and n - sent < r.params.stream_interval:
                continue
            sent = n
            chunk = output_json(
                r, service.tokenizer, final=r.finished, weight_version=service.weight_version,
                **shape,
            )  # fmt: skip
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except (DuplicateRequestError, EngineStoppedError) as exc:
        error = {"message": str(exc), "type": "invalid_request_error", "code": 400}
        yield f"data: {json.dumps({'error': error | {'retryable': False}})}\n\n"
    yield "data: [DONE]\n\n"


def _add_control(app: FastAPI, service: EngineService, limit: int) -> None:
    async def parse(request: Request, model: type[BaseModel]) -> Any:
        payload = await _read_json(request, limit, empty_ok=True)
        if not isinstance(payload, dict):
            raise BodyError("the request body must be a JSON object")
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            raise BodyError(str(exc).replace("\n", " ")) from None

    async def guarded(
        request: Request, model: type[BaseModel], run: Callable[[Any], Awaitable[Response]]
    ) -> Response:
        try:
            body = await parse(request, model)
        except BodyTooLarge as exc:
            return _message_error(_too_large(exc), 413)
        except BodyError as exc:
            return _object_error(str(exc))
        return await run(body)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        async def run(body: AbortBody) -> Response:
            await service.abort(rid=body.rid, abort_all=body.abort_all)
            return Response(status_code=200)

        return await guarded(request, AbortBody, run)

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        async def run(body: PauseBody) -> Response:
            await service.pause(body.mode)
            return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

        return await guarded(request, PauseBody, run)

    @app.post("/continue_generation")
    async def continue_generation(request: Request) -> Response:
        async def run(body: ContinueBody) -> Response:
            await service.resume()
            return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

        return await guarded(request, ContinueBody, run)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        async def run(body: UpdateWeightsBody) -> Response:
            try:
                message = await service.update_weights(
                    model_path=body.model_path,
                    weight_version=body.weight_version,
                    abort_all_requests=body.abort_all_requests,
                    flush_cache=body.flush_cache,
                )
            except WeightUpdateError as exc:
                failure = {"success": False, "message": str(exc), "num_paused_requests": 0}
                return JSONResponse(failure, status_code=exc.status)
            return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

        return await guarded(request, UpdateWeightsBody, run)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        async def run(body: UpdateWeightVersionBody) -> Response:
            await service.set_weight_version(
                body.new_version, abort_all_requests=body.abort_all_requests
            )
            message = f"Weight version updated to {body.new_version}"
            return JSONResponse(
                {"success": True, "message": message, "new_version": body.new_version}
            )

        return await guarded(request, UpdateWeightVersionBody, run)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await service.flush_cache():
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details.")
        loads = service.loads()
        return PlainTextResponse(
            "Cache not flushed: requests are running "
            f"(running {loads['num_running_reqs']}, waiting {loads['num_waiting_reqs']}).",
            status_code=400,
        )


_LOAD_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}


def _add_info(app: FastAPI, service: EngineService, config: EngineConfig) -> None:
    runner = service.runner

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": runner.model_path,
            "tokenizer_path": runner.tokenizer_path,
            "served_model_name": config.served_model_name or runner.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": service.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": runner.model_type,
            "architectures": runner.architectures,
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        args = {k: v for k, v in asdict(config).items() if k not in {"api_key", "admin_api_key"}}
        limits = service.limits
        return args | {
            "context_length": runner.context_length,
            "vocab_size": runner.vocab_size,
            "max_total_num_tokens": limits.max_total_tokens,
            "max_running_requests": limits.max_running,
            "max_prefill_tokens": limits.max_prefill_tokens,
            "max_req_input_len": runner.context_length - 1,
            "incremental_streaming_output": False,
            "weight_version": service.weight_version,
            "device": str(runner.device),
            "dtype": str(runner.dtype).removeprefix("torch."),
            "tp_size": 1,
            "dp_size": 1,
            "version": VERSION,
            "startup_time": service.started_at,
            "internal_states": [service.loads()],
        }

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if await service.healthy(generate=False) else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return Response(status_code=200 if await service.healthy(generate=True) else 503)

    @app.get("/v1/loads")
    async def v1_loads(include: str = "all") -> Response:
        sections = {s.strip() for s in include.split(",") if s.strip()}
        unknown = sorted(sections - _LOAD_SECTIONS)
        if unknown:
            return _message_error(f"invalid include {unknown}; valid: {sorted(_LOAD_SECTIONS)}")
        load = {"dp_rank": 0} | service.loads()
        return JSONResponse(
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "version": VERSION,
                "accelerator": "cuda" if runner.device.type == "cuda" else "cpu",
                "num_accelerators": torch.cuda.device_count()
                if runner.device.type == "cuda"
                else 0,
                "loads": [load],
            }
        )

    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        load = service.loads()
        return [
            {
                "dp_rank": 0,
                "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                "num_waiting_reqs": load["num_waiting_reqs"],
                "num_tokens": load["num_used_tokens"],
                "num_pending_tokens": load["num_waiting_uncached_tokens"],
                "ts_tic": time.time(),
            }
        ]
