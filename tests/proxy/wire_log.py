"""The proxy's engine client, keeping every ``/generate`` request and answer as they went over
HTTP, so that a test can hold what the proxy recorded against what the engine saw and said."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from dressage.proxy.engine_client import EngineClient, PromptIds
from dressage.proxy.http1 import RawResponse
from tests.helpers import ENGINE_KEY


class WireLog(EngineClient):
    """The engine client, keeping each /generate request and answer as they went over HTTP."""

    def __init__(self, url: str) -> None:
        super().__init__(url, retries=0, admin_key=ENGINE_KEY)
        self.requests: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []

    def _payload(
        self,
        prompt: PromptIds,
        sampling: dict[str, Any],
        rid: str,
        stream: bool,
        top_logprobs: int = 0,
    ) -> bytes:
        body = super()._payload(prompt, sampling, rid, stream, top_logprobs)
        self.requests.append(json.loads(body))
        return body

    async def _post_generate(self, body: bytes, headers: list[tuple[str, str]]) -> RawResponse:
        response = await super()._post_generate(body, headers)
        self.answers.append(json.loads(response.body))
        return response

    async def _chunks(self, batches: AsyncIterator[bytes], rid: str) -> AsyncIterator[Any]:
        last: list[dict[str, Any]] = []

        async def tee() -> AsyncIterator[bytes]:
            async for block in batches:
                for line in block.split(b"\n"):
                    if line.startswith(b"data: {"):
                        last[:] = [json.loads(line[6:])]
                yield block

        async for out in super()._chunks(tee(), rid):
            yield out
        self.answers.append(last[0])  # cumulative: the last chunk holds every token
