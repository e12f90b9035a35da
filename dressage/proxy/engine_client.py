"""The proxy's client of the engine port: SGLang's native API, directly or through its router.

    engine = EngineClient("http://127.0.0.1:30000")
    out = await engine.generate(PromptIds.of([1, 2, 3]), {"max_new_tokens": 16},
                                rid="req-1", routing_key="session-7")
    out.output_ids, out.logprobs, out.versions, out.finish       # one entry per generated token

Facts it relies on (docs/sglang.md): ``/generate`` takes ``input_ids`` as given and, with
``return_logprob``, returns ``meta_info.output_token_logprobs`` as ``[logprob, id, text]``
triples; ``finish_reason`` is ``{"type": "stop"|"length"|"abort", ...}``; streams are SSE,
cumulative unless the server streams increments; the router (sglang-router / SMG) proxies
``/generate`` with ``X-SMG-Routing-Key`` for consistent hashing, lists workers at ``GET /workers``
and has no ``/abort_request`` or pause routes, so control calls fan out to every worker
(a plain server answers ``/workers`` with 404 and is its own only worker); the weight version is
read from ``/model_info``. Connection failures and 503s are retried with exponential backoff; 4xx
answers are not. Keys (docs/sglang.md section 7.4): ``api_key`` travels on every call,
``admin_key`` instead on the control calls (abort, pause, continue, and the ``/workers`` lookup
before them) when given, as SGLang's ``--admin-api-key`` asks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from dressage.proxy.http1 import ConnectFailed, HTTP1Pool, ProtocolFailure, RawResponse

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineOutput",
    "EngineRejectedError",
    "EngineUnavailableError",
    "PromptIds",
    "parse_version",
]

log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class PromptIds:
    """Prompt token ids with their JSON text kept alongside, so that a segment's prefix is
    serialised once and each turn only encodes its delta (``json.dumps`` of 30k ids is ~4 ms)."""

    json_body: bytes
    """The ids comma-separated, each followed by a comma (``b"1,2,3,"``)."""
    length: int

    @staticmethod
    def encode_ids(ids: Sequence[int]) -> bytes:
        return "".join([f"{i}," for i in ids]).encode() if ids else b""

    @classmethod
    def of(cls, ids: Sequence[int]) -> PromptIds:
        return cls(cls.encode_ids(ids), len(ids))

    def extended(self, ids: Sequence[int]) -> PromptIds:
        if not ids:
            return self
        return PromptIds(self.json_body + self.encode_ids(ids), self.length + len(ids))

    def json_list(self) -> bytes:
        return b"[" + self.json_body[:-1] + b"]"


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


def _triples(meta: dict[str, Any], rid: str, url: str) -> tuple[list[int], list[float]]:
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise EngineError(url, f"request {rid}: meta_info has no output_token_logprobs")
    try:
        return [int(t[1]) for t in triples], [float(t[0]) for t in triples]
    except (TypeError, ValueError, IndexError) as exc:
        raise EngineError(url, f"request {rid}: malformed output_token_logprobs ({exc})") from None


def _versions(meta: dict[str, Any], start: int, count: int) -> list[int]:
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


def _error_message(body: bytes) -> str:
    """The message of any SGLang / router error shape (docs/sglang.md sections 6, 7)."""
    try:
        data = json.loads(body)
    except ValueError:
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


class EngineClient:
    """Async client of one engine URL (a router or a server); see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        admin_key: str | None = None,
        timeout: float = 1800.0,
        retries: int = 4,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._pool = HTTP1Pool(self.url)
        self._headers: list[tuple[str, str]] = [("content-type", "application/json")]
        if api_key:
            self._headers.append(("authorization", f"Bearer {api_key}"))
        self._api_key = api_key
        control_key = admin_key or api_key
        self._control_headers = {"authorization": f"Bearer {control_key}"} if control_key else {}
        self._control: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------------------ generate
    def _payload(
        self, prompt: PromptIds, sampling_params: dict[str, Any], rid: str, stream: bool
    ) -> bytes:
        rest = {
            "sampling_params": sampling_params,
            "return_logprob": True,
            "rid": rid,
            "stream": stream,
        }
        return b'{"input_ids":' + prompt.json_list() + b"," + json.dumps(rest).encode()[1:]

    def _request_headers(self, routing_key: str | None) -> list[tuple[str, str]]:
        if routing_key is None:
            return self._headers
        return [*self._headers, ("x-smg-routing-key", routing_key)]

    async def _pause_before_retry(self, attempt: int, reason: str) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        delay *= 1 + 0.2 * random.random()
        log.warning("engine %s: %s; retry %d in %.2f s", self.url, reason, attempt + 1, delay)
        await asyncio.sleep(delay)

    async def _post_generate(self, body: bytes, headers: list[tuple[str, str]]) -> RawResponse:
        attempt = 0
        while True:
            try:
                response = await self._pool.request(
                    "POST", "/generate", body, headers=headers, timeout=self.timeout
                )
            except ConnectFailed as exc:
                if attempt >= self.retries:
                    raise EngineUnavailableError(self.url, f"unreachable ({exc})") from None
                await self._pause_before_retry(attempt, "unreachable")
            except ProtocolFailure as exc:
                raise EngineError(self.url, f"/generate failed mid-answer: {exc}") from None
            else:
                if response.status != 503:
                    return response
                if attempt >= self.retries:
                    raise EngineUnavailableError(self.url, _error_message(response.body))
                await self._pause_before_retry(attempt, _error_message(response.body))
            attempt += 1

    async def generate(
        self,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        rid: str,
        routing_key: str | None = None,
    ) -> EngineOutput:
        """One non-streaming ``/generate`` (``n`` = 1). An abort comes back as an output whose
        ``finish["type"]`` is ``"abort"``, with the partial tokens; errors raise
        :class:`EngineError`."""
        body = self._payload(prompt, sampling_params, rid, stream=False)
        response = await self._post_generate(body, self._request_headers(routing_key))
        if response.status != 200:
            raise EngineRejectedError(self.url, response.status, _error_message(response.body))
        try:
            data = json.loads(response.body)
        except ValueError:
            raise EngineError(self.url, f"request {rid}: /generate answered non-JSON") from None
        return self._output(data, rid)

    def _output(self, data: Any, rid: str) -> EngineOutput:
        if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
            raise EngineError(self.url, f"request {rid}: unexpected /generate answer {data!r:.200}")
        meta = data["meta_info"]
        ids, logprobs = _triples(meta, rid, self.url)
        finish = meta.get("finish_reason")
        _raise_for_error_abort(finish, self.url, rid)
        return EngineOutput(
            rid=rid,
            output_ids=ids,
            logprobs=logprobs,
            versions=_versions(meta, 0, len(ids)),
            finish=finish if isinstance(finish, dict) else None,
            weight_version=str(meta.get("weight_version", "")),
            prompt_tokens=meta.get("prompt_tokens"),
            cached_tokens=meta.get("cached_tokens"),
        )

    async def generate_stream(
        self,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        rid: str,
        routing_key: str | None = None,
    ) -> AsyncGenerator[EngineOutput, None]:
        """Streaming ``/generate``: yields the new tokens of each chunk; the last one carries
        ``finish``. Cumulative and incremental chunks are both understood."""
        body = self._payload(prompt, sampling_params, rid, stream=True)
        headers = self._request_headers(routing_key)
        attempt = 0
        while True:
            try:
                async with self._pool.stream(
                    "POST", "/generate", body, headers=headers, timeout=self.timeout
                ) as response:
                    if response.status == 503 and attempt < self.retries:
                        reason = _error_message(await response.read())
                    elif response.status != 200:
                        message = _error_message(await response.read())
                        if response.status == 503:
                            raise EngineUnavailableError(self.url, message)
                        raise EngineRejectedError(self.url, response.status, message)
                    else:
                        async for out in self._chunks(response.lines(), rid):
                            yield out
                        return
            except ConnectFailed as exc:
                if attempt >= self.retries:
                    raise EngineUnavailableError(self.url, f"unreachable ({exc})") from None
                reason = "unreachable"
            except ProtocolFailure as exc:
                raise EngineError(self.url, f"/generate stream broke: {exc}") from None
            await self._pause_before_retry(attempt, reason)
            attempt += 1

    async def _chunks(self, lines: AsyncIterator[bytes], rid: str) -> AsyncIterator[EngineOutput]:
        received = 0
        async for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                data = json.loads(payload)
            except ValueError:
                raise EngineError(
                    self.url, f"request {rid}: bad stream chunk {payload!r:.200}"
                ) from None
            if isinstance(data, dict) and "error" in data:
                raise EngineRejectedError(self.url, 400, _error_message(payload))
            if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
                raise EngineError(self.url, f"request {rid}: unexpected chunk {data!r:.200}")
            meta = data["meta_info"]
            ids, logprobs = _triples(meta, rid, self.url)
            count = meta.get("completion_tokens")
            # Cumulative chunks (SGLang's default) repeat every token so far; incremental ones
            # (--incremental-streaming-output) carry only the new ones, with a cumulative count.
            start = received if count is None or count == len(ids) else 0
            new_ids, new_logprobs = ids[start:], logprobs[start:]
            finish = meta.get("finish_reason")
            _raise_for_error_abort(finish, self.url, rid)
            yield EngineOutput(
                rid=rid,
                output_ids=new_ids,
                logprobs=new_logprobs,
                versions=_versions(meta, received, len(new_ids)),
                finish=finish if isinstance(finish, dict) else None,
                weight_version=str(meta.get("weight_version", "")),
                prompt_tokens=meta.get("prompt_tokens"),
                cached_tokens=meta.get("cached_tokens"),
            )
            received += len(new_ids)
            if isinstance(finish, dict):
                return
        raise EngineError(self.url, f"request {rid}: the stream ended without a finish_reason")

    # ------------------------------------------------------------------------------ control
    def _client(self) -> httpx.AsyncClient:
        if self._control is None:
            headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            # An engine's uvicorn closes connections idle for 5 s; dropping ours after 2 s keeps
            # a control call from reusing one the engine is closing (a spurious ReadError).
            limits = httpx.Limits(keepalive_expiry=2.0)
            self._control = httpx.AsyncClient(timeout=30.0, headers=headers, limits=limits)
        return self._control

    async def _control_call(
        self, method: str, url: str, body: dict[str, Any] | None = None, *, admin: bool = False
    ) -> httpx.Response:
        headers = self._control_headers if admin else None
        attempt = 0
        while True:
            try:
                return await self._client().request(method, url, json=body, headers=headers)
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise EngineUnavailableError(url, f"unreachable ({exc!r})") from None
                await self._pause_before_retry(attempt, f"{method} {url} failed")
            attempt += 1

    async def workers(self) -> list[str]:
        """Worker URLs behind a router (``GET /workers``); a plain server is its only worker.

        Asked with the control key: it precedes control calls, and the embedded engine treats
        every path it does not serve as a control path (401 without the key, else 404).
        """
        response = await self._control_call("GET", f"{self.url}/workers", admin=True)
        if response.status_code == 404:
            return [self.url]
        if response.status_code != 200:
            raise EngineRejectedError(self.url, response.status_code, response.text[:500])
        try:
            workers = response.json().get("workers", [])
            urls = [str(w["url"]).rstrip("/") for w in workers]
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise EngineError(self.url, f"GET /workers: unexpected answer ({exc})") from None
        return urls

    async def _each_worker(self, path: str, body: dict[str, Any]) -> None:
        urls = await self.workers()
        responses = await asyncio.gather(
            *(self._control_call("POST", f"{url}{path}", body, admin=True) for url in urls)
        )
        failed = [
            f"{url}: HTTP {r.status_code} {r.text[:200]}"
            for url, r in zip(urls, responses, strict=True)
            if r.status_code != 200
        ]
        if failed:
            hint = ""
            if any(r.status_code == 401 for r in responses):
                hint = " (401: give the proxy the engine's control key, DRESSAGE_ENGINE_ADMIN_KEY)"
            raise EngineError(self.url, f"POST {path} failed on {failed}{hint}")

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """``/abort_request`` on every worker (SGLang matches ``rid`` as a prefix)."""
        if not rid and not abort_all:
            raise ValueError("abort needs a rid or abort_all=True")
        body: dict[str, Any] = {"abort_all": True} if abort_all else {"rid": rid}
        await self._each_worker("/abort_request", body)

    async def pause(self, mode: str = "abort") -> None:
        await self._each_worker("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._each_worker("/continue_generation", {})

    async def model_info(self) -> dict[str, Any]:
        response = await self._control_call("GET", f"{self.url}/model_info")
        if response.status_code != 200:
            raise EngineRejectedError(self.url, response.status_code, response.text[:500])
        info = response.json()
        if not isinstance(info, dict):
            raise EngineError(self.url, f"GET /model_info: unexpected answer {info!r:.200}")
        return info

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (``/get_server_info`` on a 404); {} when the engine has neither."""
        for path in ("/server_info", "/get_server_info"):
            response = await self._control_call("GET", f"{self.url}{path}")
            if response.status_code == 404:
                continue
            if response.status_code != 200:
                raise EngineRejectedError(self.url, response.status_code, response.text[:500])
            info = response.json()
            return info if isinstance(info, dict) else {}
        return {}

    async def weight_version(self) -> str:
        """The engine's current ``weight_version`` (from ``/model_info``)."""
        return str((await self.model_info()).get("weight_version", ""))

    async def healthy(self) -> bool:
        try:
            response = await self._client().get(f"{self.url}/health", timeout=5.0)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        await self._pool.aclose()
        if self._control is not None:
            await self._control.aclose()


def _raise_for_error_abort(finish: Any, url: str, rid: str) -> None:
    """An abort that carries an error status is a failure, not a partial output (section 7)."""
    if isinstance(finish, dict) and finish.get("type") == "abort":
        status = finish.get("status_code")
        if isinstance(status, int) and status >= 400:
            message = str(finish.get("message") or "aborted")
            if status == 503:
                raise EngineUnavailableError(url, f"request {rid}: {message}")
            raise EngineRejectedError(url, status, f"request {rid}: {message}")
