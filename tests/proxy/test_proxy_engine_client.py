"""Contract tests of the engine client against docs/sglang.md: the ``/generate`` request it
sends, how it reads answers and streams, the router's worker fan-out and error body, retries.

A scripted server stands in for what cannot run here (an SGLang router with workers); the same
client against the embedded engine is exercised in ``test_proxy_e2e.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from dressage.proxy.engine_answers import (
    EngineRejectedError,
    EngineUnavailableError,
    parse_version,
    read_stream,
    token_versions,
)
from dressage.proxy.engine_client import EngineClient, PromptIds
from dressage.proxy.generation_controller import Generation, GenerationController
from dressage.proxy.testing import EngineReply, ScriptedEngine
from tests.helpers import free_port

pytestmark = pytest.mark.integration

NO_WORKERS = {
    "error": {
        "type": "Service Unavailable",
        "code": "no_available_workers",
        "message": "No available workers",
    }
}


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with(client: EngineClient, coro: Any) -> Any:
    try:
        return await coro
    finally:
        await client.aclose()


@contextmanager
def _engine(*replies: EngineReply, **options: Any) -> Iterator[ScriptedEngine]:
    queue = list(replies)

    def script(body: dict[str, Any]) -> EngineReply:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    engine = ScriptedEngine(script, **options)
    with engine.running():
        yield engine


def test_generate_sends_token_ids_logprobs_rid_and_the_routing_key() -> None:
    with _engine(EngineReply([7, 8, 9]), weight_version="4") as engine:
        client = EngineClient(engine.url, api_key="engine-key")
        out = _run(
            _with(
                client,
                client.generate(
                    PromptIds.of([1, 2, 3]),
                    {"max_new_tokens": 5, "temperature": 0.0},
                    rid="chatcmpl-1-0",
                    routing_key="session-9",
                ),
            )
        )
    (seen,) = engine.seen
    assert seen.path == "/generate"
    assert seen.body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.0},
        "return_logprob": True,
        "rid": "chatcmpl-1-0",
        "stream": False,
    }
    assert seen.headers["x-smg-routing-key"] == "session-9"
    assert seen.headers["authorization"] == "Bearer engine-key"
    assert out.output_ids == [7, 8, 9]
    assert out.logprobs == [-0.25, -0.25, -0.25]
    assert out.versions == [4, 4, 4]
    assert out.finish == {"type": "stop", "matched": 9}
    assert (out.weight_version, out.prompt_tokens, out.cached_tokens) == ("4", 3, 0)


def test_weight_versions() -> None:
    assert [parse_version(v) for v in ("12", " 3 ", "default", "v2", None, 5)] == [
        12, 3, 0, 0, 0, 5,
    ]  # fmt: skip
    spans = {
        "weight_version": "3",
        "weight_versions": [
            {"version": "2", "start": 0, "end": 2},
            {"version": "3", "start": 2, "end": 5},
        ],
    }
    assert token_versions(spans, 0, 5) == [2, 2, 3, 3, 3]  # 0.5.23: one version per token span
    assert token_versions(spans, 1, 3) == [2, 3, 3]
    assert token_versions({"weight_version": "default"}, 0, 2) == [0, 0]


async def _lines(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    """The SSE lines of ``chunks``, each arriving alone."""
    for chunk in chunks:
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n"


def _chunk(ids: list[int], total: int, finish: Any = None) -> dict[str, Any]:
    meta = {
        "completion_tokens": total,
        "finish_reason": finish,
        "weight_version": "1",
        "output_token_logprobs": [[-float(i), i, None] for i in ids],
    }
    return {"output_ids": ids, "meta_info": meta}


@pytest.mark.parametrize("incremental", [False, True])
def test_streams_cumulative_or_incremental_give_the_same_tokens(incremental: bool) -> None:
    done = {"type": "length", "length": 4}
    if incremental:
        chunks = [_chunk([1], 1), _chunk([2, 3], 3), _chunk([4], 4, done)]
    else:
        chunks = [_chunk([1], 1), _chunk([1, 2, 3], 3), _chunk([1, 2, 3, 4], 4, done)]

    async def collect() -> list[Any]:
        return [out async for out in read_stream(_lines(chunks), "r", "http://unused:1")]

    outs = _run(collect())
    assert [o.output_ids for o in outs] == [[1], [2, 3], [4]]
    assert [o.logprobs for o in outs] == [[-1.0], [-2.0, -3.0], [-4.0]]
    assert [o.finish for o in outs] == [None, None, done]


@pytest.mark.parametrize("interval", [None, 0.02])
def test_a_stream_sent_at_once_or_chunked_and_paced_gives_each_token_once(
    interval: float | None,
) -> None:
    """The events of one read go on as one output: all of them when the engine sends them at
    once; paced, they come in several (each alone unless the reader fell behind)."""
    ids = [11, 12, 13, 14, 15]
    with _engine(EngineReply(ids), stream_interval_s=interval) as engine:
        client = EngineClient(engine.url)

        async def collect() -> list[Any]:
            stream = client.generate_stream(PromptIds.of([1, 2]), {}, rid="r-1")
            return [out async for out in stream]

        outs = _run(_with(client, collect()))
    assert [i for out in outs for i in out.output_ids] == ids
    assert outs[-1].finish == {"type": "stop", "matched": 15}
    if interval is not None:  # the first token's event at once, the last 80 ms later
        assert len(outs) >= 2, outs


def test_the_scripted_engine_streams_a_chunk_every_stream_interval_tokens() -> None:
    """As SGLang does with a per-request ``stream_interval``: the bench's long streams use it."""
    ids = [11, 12, 13, 14, 15, 16, 17]
    with _engine(EngineReply(ids), stream_interval_s=0.002) as engine:
        client = EngineClient(engine.url)

        async def collect() -> list[Any]:
            stream = client.generate_stream(PromptIds.of([1]), {"stream_interval": 3}, rid="r")
            return [out async for out in stream]

        outs = _run(_with(client, collect()))
    assert [out.output_ids for out in outs] == [[11, 12, 13], [14, 15, 16], [17]]


def test_a_finished_stream_is_read_to_its_end_and_its_connection_reused() -> None:
    """After the finish chunk the client reads the rest ([DONE], the body's end), so the next
    streamed call goes over the same connection instead of a new one."""
    with _engine(EngineReply([5, 6]), stream_interval_s=0.002) as engine:
        client = EngineClient(engine.url)

        async def twice() -> tuple[list[int], int]:
            ids, idle = [], []
            for k in range(2):
                async for out in client.generate_stream(PromptIds.of([1]), {}, rid=f"r-{k}"):
                    ids += out.output_ids
                idle.append(len(client._pool._idle))
            return ids, idle

        ids, idle = _run(_with(client, twice()))
    assert ids == [5, 6, 5, 6]
    assert idle == [1, 1], "the connection went back to the pool after each stream"


def test_a_stream_error_event_is_an_error() -> None:
    async def lines() -> AsyncIterator[bytes]:
        yield b'data: {"error": {"message": "bad input", "code": 400}}\n'

    async def collect() -> None:
        async for _ in read_stream(lines(), "r", "http://unused:1"):
            pass

    with pytest.raises(EngineRejectedError, match="bad input"):
        _run(collect())


def test_router_control_calls_fan_out_to_every_worker() -> None:
    with ExitStack() as stack:
        workers = [stack.enter_context(_engine(EngineReply([1]))) for _ in range(2)]
        router = stack.enter_context(
            _engine(EngineReply([1]), workers=[w.url for w in workers], weight_version="5")
        )
        client = EngineClient(router.url)

        async def control() -> str:
            await client.abort("chatcmpl-7")
            await client.abort(abort_all=True)
            await client.pause()
            await client.resume()
            return await client.weight_version()

        assert _run(_with(client, control())) == "5"
    assert [(s.path, s.body) for s in router.seen] == [("/workers", None)] * 4 + [
        ("/model_info", None)
    ]
    for worker in workers:
        assert [(s.path, s.body) for s in worker.seen] == [
            ("/abort_request", {"rid": "chatcmpl-7"}),
            ("/abort_request", {"abort_all": True}),
            ("/pause_generation", {"mode": "abort"}),
            ("/continue_generation", {}),
        ]


def test_a_plain_server_is_its_own_only_worker() -> None:
    with _engine(EngineReply([1])) as engine:
        client = EngineClient(engine.url)
        _run(_with(client, client.abort("r-1")))
    assert [(s.path, s.body) for s in engine.seen] == [
        ("/workers", None),
        ("/abort_request", {"rid": "r-1"}),
    ]


async def _generate(client: EngineClient, stream: bool) -> list[int]:
    """One ``/generate`` of prompt ``[1]``, plain or streamed; the output ids."""
    try:
        if not stream:
            return (await client.generate(PromptIds.of([1]), {}, rid="r")).output_ids
        ids: list[int] = []
        async for out in client.generate_stream(PromptIds.of([1]), {}, rid="r"):
            ids += out.output_ids
        return ids
    finally:
        await client.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_no_worker_behind_the_router_is_retried_then_503(stream: bool) -> None:
    with _engine(EngineReply([], http_status=503, error_body=NO_WORKERS)) as router:
        client = EngineClient(router.url, retries=2, backoff=0.01)
        with pytest.raises(EngineUnavailableError) as info:
            _run(_generate(client, stream))
    assert len(router.seen) == 3
    assert info.value.status == 503
    assert router.url in str(info.value) and "no_available_workers" in str(info.value)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_503_then_an_answer_is_the_answer(stream: bool) -> None:
    no_worker = EngineReply([], http_status=503, error_body=NO_WORKERS)
    with _engine(no_worker, no_worker, EngineReply([7, 8])) as router:
        client = EngineClient(router.url, retries=2, backoff=0.01)
        assert _run(_generate(client, stream)) == [7, 8]
    assert len(router.seen) == 3


@pytest.mark.parametrize("call", ["generate", "generate_stream", "model_info"])
def test_an_unreachable_engine_is_retried_with_backoff_then_503(call: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    client = EngineClient(url, retries=3, backoff=0.02)
    if call == "model_info":  # a control call (httpx), named by its URL
        attempt: Any = _with(client, client.model_info())
    else:
        attempt = _generate(client, stream=call == "generate_stream")
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match=f"engine at {url}\\S*: unreachable") as info:
        _run(attempt)
    assert time.monotonic() - started >= 0.02 + 0.04 + 0.08  # exponential backoff
    assert info.value.status == 503


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_4xx_is_not_retried(stream: bool) -> None:
    refusal = EngineReply([], http_status=400, error_body={"error": {"message": "top_k bad"}})
    with _engine(refusal) as engine:
        client = EngineClient(engine.url, retries=3, backoff=0.01)
        with pytest.raises(EngineRejectedError, match="HTTP 400: top_k bad") as info:
            _run(_generate(client, stream))
    assert len(engine.seen) == 1 and info.value.status == 400


def test_aborts_partial_output_versus_error_status() -> None:
    with _engine(EngineReply([4, 5], finish="abort"), weight_version="2") as engine:
        client = EngineClient(engine.url)
        out = _run(_with(client, client.generate(PromptIds.of([1]), {}, rid="r")))
    assert out.output_ids == [4, 5] and out.finish is not None
    assert out.finish["type"] == "abort"
    with _engine(EngineReply([], finish="abort", status_code=500)) as engine:
        client = EngineClient(engine.url)
        with pytest.raises(EngineRejectedError) as info:
            _run(_with(client, client.generate(PromptIds.of([1]), {}, rid="r")))
    assert info.value.status == 502  # an engine failure is a bad gateway to the agent


def test_a_stale_pooled_connection_is_replaced_transparently() -> None:
    engine = ScriptedEngine(lambda body: EngineReply([3]))
    client = EngineClient("http://127.0.0.1:1")

    async def twice(port_holder: list[int]) -> list[int]:
        ids = []
        for restart in (False, True):
            if restart:  # the engine restarts between calls: the pooled socket is dead
                stack.close()
                stack.enter_context(engine.running(port=port_holder[0]))
            out = await client.generate(PromptIds.of([1]), {}, rid=f"r{restart}")
            ids += out.output_ids
        await client.aclose()
        return ids

    with ExitStack() as stack:
        url = stack.enter_context(engine.running())
        port = int(url.rsplit(":", 1)[1])
        client = EngineClient(url, retries=0)
        assert _run(twice([port])) == [3, 3]


def test_the_controller_resumes_an_abort_when_its_policy_says_so() -> None:
    """The pause/resume extension point: chunks accumulate, the budget shrinks, the prompt grows
    by the partial output, each token keeps its version."""
    with ExitStack() as stack:
        engine = stack.enter_context(
            _engine(EngineReply([10, 11], finish="abort"), EngineReply([12, 13, 14]))
        )

        class ResumeOnce:
            calls = 0

            async def should_resume(self, session_id: str, generation: Generation) -> bool:
                ResumeOnce.calls += 1
                engine.weight_version = "8"  # the weights changed while paused
                return ResumeOnce.calls == 1

        client = EngineClient(engine.url)
        controller = GenerationController(client, resume_policy=ResumeOnce())
        generation = _run(
            _with(
                client,
                controller.generate(
                    "s", PromptIds.of([1, 2]), {"max_new_tokens": 6}, request_id="c"
                ),
            )
        )
    first, second = (s.body for s in engine.seen)
    assert first["input_ids"] == [1, 2] and first["sampling_params"]["max_new_tokens"] == 6
    assert second["input_ids"] == [1, 2, 10, 11]
    assert second["sampling_params"]["max_new_tokens"] == 4
    assert [first["rid"], second["rid"]] == ["c-0", "c-1"]
    assert generation.output_ids == [10, 11, 12, 13, 14]
    assert generation.versions == [0, 0, 8, 8, 8]
    assert generation.finish_type == "stop" and generation.engine_requests == 2


def test_sse_lines_are_read_in_every_spelling_sglang_or_a_router_may_send() -> None:
    """``data:`` with or without its space, spaces around the payload, ``\\r\\n`` line ends,
    comments (one that holds ``data:``) and other fields between events, ``[DONE]`` spelled
    either way: the same tokens, whether the lines come one block each or all in one."""
    done = {"type": "length", "length": 3}
    one, two, three = (
        json.dumps(c).encode()
        for c in (_chunk([1], 1), _chunk([1, 2], 2), _chunk([1, 2, 3], 3, done))
    )
    lines = [
        b": keep-alive\r\n",
        b": a comment with data: inside, not an event\n",
        b"data:" + one + b"\r\n",
        b"\r\n",
        b"event: message\n",
        b"data:   " + two + b"  \n\n",
        b"data: " + three + b"\r\n\r\n",
        b"data:[DONE]\r\n",
    ]

    async def collect(blocks: list[bytes]) -> list[Any]:
        async def source() -> AsyncIterator[bytes]:
            for block in blocks:
                yield block

        return [out async for out in read_stream(source(), "r", "http://unused:1")]

    for blocks in (lines, [b"".join(lines)]):
        outs = _run(collect(blocks))
        assert [i for o in outs for i in o.output_ids] == [1, 2, 3]
        assert outs[-1].finish == done
