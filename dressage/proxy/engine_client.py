"""The proxy's client of the engine port: SGLang's native API, directly or through its router.

    engine = EngineClient("http://127.0.0.1:30000")
    out = await engine.generate(PromptIds.of([1, 2, 3]), {"max_new_tokens": 16},
                                rid="req-1", routing_key="session-7")
    out.output_ids, out.logprobs, out.versions, out.finish       # one entry per generated token

Facts it relies on (docs/sglang.md): ``/generate`` takes ``input_ids`` as given and, with
``return_logprob``, returns each token's log-prob (the answers, whole or streamed as SSE, are read
by :mod:`~dressage.proxy.engine_answers`); the router (sglang-router / SMG) proxies
``/generate`` with ``X-SMG-Routing-Key`` for consistent hashing, lists workers at ``GET /workers``
and has no ``/abort_request`` or pause routes, so control calls fan out to every worker
(a plain server answers ``/workers`` with 404 and is its own only worker); the weight version is
read from ``/model_info``. Connection failures and 503s are retried with exponential backoff, by
one policy for every call (:meth:`EngineClient._retrying`); 4xx answers are not. Keys
(docs/sglang.md section 7.4): ``api_key`` travels on every call, ``admin_key`` instead on the
control calls (abort, pause, continue, and the ``/workers`` lookup before them) when given, as
SGLang's ``--admin-api-key`` asks.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import orjson

from dressage.http_json import dumps, loads_engine
from dressage.proxy.engine_answers import (
    EngineError,
    EngineOutput,
    EngineRejectedError,
    EngineUnavailableError,
    error_message,
    read_output,
    read_stream,
)
from dressage.proxy.http1 import (
    ConnectFailed,
    HTTP1Pool,
    ProtocolFailure,
    RawResponse,
    StreamedResponse,
)

__all__ = ["EngineClient", "PromptIds"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Retryable(Exception):
    """One attempt failed in a way the next may not: no connection, or no worker (a 503)."""

    def __init__(self, url: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason
        """What the retry's log line says."""
        self.message = message
        """The :class:`EngineUnavailableError`'s message once every retry failed."""


@dataclass(frozen=True, slots=True)
class PromptIds:
    """Prompt token ids with their JSON text kept alongside, so that a segment's prefix is
    serialised once and each turn only encodes its delta (``json.dumps`` of 30k ids is ~4 ms)."""

    json_body: bytes
    """The ids comma-separated, each followed by a comma (``b"1,2,3,"``)."""
    length: int

    @staticmethod
    def encode_ids(ids: Sequence[int]) -> bytes:
        if not ids:
            return b""
        if type(ids) is list:
            try:  # orjson writes a list of ints 10x faster than joining their text
                return orjson.dumps(ids)[1:-1] + b","
            except TypeError:  # an int past 64 bits: written as Python writes it
                pass
        return "".join([f"{int(i)}," for i in ids]).encode()

    @classmethod
    def of(cls, ids: Sequence[int]) -> PromptIds:
        return cls(cls.encode_ids(ids), len(ids))

    def extended(self, ids: Sequence[int]) -> PromptIds:
        if not ids:
            return self
        return PromptIds(self.json_body + self.encode_ids(ids), self.length + len(ids))

    def json_list(self) -> bytes:
        return b"[" + self.json_body[:-1] + b"]"


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
        stream_coalesce: float = 0.0,
    ) -> None:
        """``stream_coalesce``: the period of the clock whose ticks a stream's chunks gather
        until, after each read (:class:`~dressage.proxy.http1.StreamedResponse`); 0 reads each
        as it comes."""
        self.url = url.rstrip("/")
        self.stream_coalesce = stream_coalesce
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
        self,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        rid: str,
        stream: bool,
        top_logprobs: int = 0,
    ) -> bytes:
        rest: dict[str, Any] = {
            "sampling_params": sampling_params,
            "return_logprob": True,
            "rid": rid,
            "stream": stream,
        }
        if top_logprobs:
            rest["top_logprobs_num"] = top_logprobs
        return b'{"input_ids":' + prompt.json_list() + b"," + dumps(rest)[1:]

    def _request_headers(self, routing_key: str | None) -> list[tuple[str, str]]:
        if routing_key is None:
            return self._headers
        return [*self._headers, ("x-smg-routing-key", routing_key)]

    async def _pause_before_retry(self, attempt: int, reason: str) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        delay *= 1 + 0.2 * random.random()
        log.warning("engine %s: %s; retry %d in %.2f s", self.url, reason, attempt + 1, delay)
        await asyncio.sleep(delay)

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` until it does not raise :class:`_Retryable`, backing off exponentially
        in between; after ``retries`` retries, :class:`EngineUnavailableError` (the one retry
        policy of every engine call)."""
        for n in range(self.retries + 1):
            try:
                return await attempt()
            except _Retryable as failed:
                if n >= self.retries:
                    raise EngineUnavailableError(failed.url, failed.message) from None
                await self._pause_before_retry(n, failed.reason)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _post_generate(self, body: bytes, headers: list[tuple[str, str]]) -> RawResponse:
        async def attempt() -> RawResponse:
            try:
                response = await self._pool.request(
                    "POST", "/generate", body, headers=headers, timeout=self.timeout
                )
            except ConnectFailed as exc:
                raise _Retryable(self.url, "unreachable", f"unreachable ({exc})") from None
            except ProtocolFailure as exc:
                raise EngineError(self.url, f"/generate failed mid-answer: {exc}") from None
            if response.status == 503:
                message = error_message(response.body)
                raise _Retryable(self.url, message, message)
            return response

        return await self._retrying(attempt)

    async def generate(
        self,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        rid: str,
        routing_key: str | None = None,
        top_logprobs: int = 0,
    ) -> EngineOutput:
        """One non-streaming ``/generate`` (``n`` = 1). An abort comes back as an output whose
        ``finish["type"]`` is ``"abort"``, with the partial tokens; errors raise
        :class:`EngineError`. ``top_logprobs``: the engine's ``top_logprobs_num``."""
        body = self._payload(prompt, sampling_params, rid, stream=False, top_logprobs=top_logprobs)
        response = await self._post_generate(body, self._request_headers(routing_key))
        if response.status != 200:
            raise EngineRejectedError(self.url, response.status, error_message(response.body))
        try:
            data = loads_engine(response.body)
        except ValueError:
            raise EngineError(self.url, f"request {rid}: /generate answered non-JSON") from None
        return self._output(data, rid)

    def _output(self, data: Any, rid: str) -> EngineOutput:
        """A whole answer read (a method, so that a test's client can keep what it read)."""
        return read_output(data, rid, self.url)

    def _chunks(self, batches: AsyncIterator[bytes], rid: str) -> AsyncIterator[EngineOutput]:
        """A streamed answer read (a method, so that a test's client can keep what it read)."""
        return read_stream(batches, rid, self.url)

    async def generate_stream(
        self,
        prompt: PromptIds,
        sampling_params: dict[str, Any],
        *,
        rid: str,
        routing_key: str | None = None,
        top_logprobs: int = 0,
    ) -> AsyncGenerator[EngineOutput, None]:
        """Streaming ``/generate``: yields the new tokens of each chunk; the last one carries
        ``finish``. Cumulative and incremental chunks are both understood."""
        body = self._payload(prompt, sampling_params, rid, stream=True, top_logprobs=top_logprobs)
        headers = self._request_headers(routing_key)
        try:
            response, opened = await self._retrying(lambda: self._open_stream(body, headers))
            async with opened:
                async for out in self._chunks(response.batches(), rid):
                    yield out
        except ProtocolFailure as exc:
            raise EngineError(self.url, f"/generate stream broke: {exc}") from None

    async def _open_stream(
        self, body: bytes, headers: list[tuple[str, str]]
    ) -> tuple[StreamedResponse, AsyncExitStack]:
        """One attempt at a streamed ``/generate``: its 200 response, still open, and the stack
        that closes it; a 503 or no connection is :class:`_Retryable`, another status an error."""
        async with AsyncExitStack() as stack:
            try:
                response = await stack.enter_async_context(
                    self._pool.stream(
                        "POST",
                        "/generate",
                        body,
                        headers=headers,
                        timeout=self.timeout,
                        coalesce=self.stream_coalesce,
                    )
                )
            except ConnectFailed as exc:
                raise _Retryable(self.url, "unreachable", f"unreachable ({exc})") from None
            if response.status == 200:
                return response, stack.pop_all()
            message = error_message(await response.read())
            if response.status != 503:
                raise EngineRejectedError(self.url, response.status, message)
        raise _Retryable(self.url, message, message)

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

        async def attempt() -> httpx.Response:
            try:
                return await self._client().request(method, url, json=body, headers=headers)
            except httpx.TransportError as exc:
                raise _Retryable(url, f"{method} {url} failed", f"unreachable ({exc!r})") from None

        return await self._retrying(attempt)

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
        """``GET /model_info`` (``/get_model_info`` on a 404: a router serves only that)."""
        response = await self._control_call("GET", f"{self.url}/model_info")
        if response.status_code == 404:
            response = await self._control_call("GET", f"{self.url}/get_model_info")
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
