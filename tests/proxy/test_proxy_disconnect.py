"""A client that gives up mid-call: the engine request is aborted, what it generated is kept as
an aborted, unanswered step, and the trajectory trains nothing (issue 15, item 4).

The scripted engine holds the call's generation until ``/abort_request`` names it (as a long
generation would run on); the client is a raw socket closed once the engine has started, so the
moment it leaves is an event, not a timeout.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dressage.proxy.testing import EngineReply
from dressage.proxy.tito import TITOTokenizer
from dressage.rollout.artifacts.samples import write_sample_from_segment
from dressage.trajectory import Segment
from dressage.types import Sample
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

ANSWER = "ok\n</think>\n\nFine.<|im_end|>"
PARTIAL = "thinking about it for a very long"
USER = {"role": "user", "content": "hello"}


def _wait_for(what: str, check: Callable[[], bool]) -> None:
    for _ in range(600):  # bounded: 30 s
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _give_up_mid_call(url: str, session: str, body: dict[str, Any], started: Any) -> None:
    """Send the call, wait until the engine generates for it (and, streamed, until the first
    chunk arrived), then close the connection without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /sessions/%s/v1/chat/completions HTTP/1.1\r\nhost: x\r\n" % session.encode()
            + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(raw)
            + raw
        )
        assert started.wait(30), "the engine never started the call"
        if body.get("stream"):
            assert b"data: " in sock.recv(65536)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_gives_up_aborts_the_engine_and_its_step_trains_nothing(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script], stream: bool
) -> None:
    partial = qwen35_tito.encode(PARTIAL)
    plan = script(ANSWER, EngineReply(partial, hold=True), ANSWER)
    with scripted_proxy(plan, tmp_path, qwen35_tito) as (url, engine):
        first = httpx.post(f"{url}/sessions/gone/v1/chat/completions", json={"messages": [USER]})
        history = [USER, first.json()["choices"][0]["message"], {"role": "user", "content": "?"}]
        body = {"messages": history, "max_tokens": 1500, "stream": stream}
        _give_up_mid_call(url, "gone", body, engine.held)

        _wait_for("the unanswered step", lambda: _trajectory(url)["steps"][1:] != [])
        (rid,) = engine.aborted
        steps = _trajectory(url)["steps"]
        assert rid.startswith(steps[1]["request_id"]), "the engine request was aborted"
        assert steps[1]["output_ids"] == partial, "what it generated is kept"
        assert steps[1]["finish_reason"] == "abort"
        assert steps[1]["extra"]["client_disconnected"] is True
        assert (
            steps[0]["finish_reason"] == "stop" and "client_disconnected" not in steps[0]["extra"]
        )

        # the agent retries: the session goes on (a new segment: the aborted answer is not in
        # its history), and the whole trajectory is marked to train nothing
        retry = httpx.post(f"{url}/sessions/gone/v1/chat/completions", json={"messages": history})
        assert retry.status_code == 200
        segments = httpx.post(f"{url}/v1/sessions/gone/finalize").json()["segments"]
    assert [s["finish_reason"] for s in segments] == ["segment_boundary", "stop"]
    assert segments[0]["extra_info"]["last_finish_reason"] == "abort"
    for raw in segments:
        segment = Segment.from_dict(raw)
        assert "client disconnected" in segment.extra_info["no_grad_reason"]
        sample = write_sample_from_segment(Sample(), segment, args=_ARGS)
        assert sample.remove_sample and not any(sample.loss_mask), "nothing of it trains"


def test_a_client_that_leaves_while_the_proxy_is_paused_is_never_generated_for(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    """A call held by a rollout pause whose client leaves stops waiting and records nothing."""
    with scripted_proxy(script(ANSWER), tmp_path, qwen35_tito) as (url, engine):
        httpx.post(f"{url}/v1/rollout/pause", json={"reason": "test"}).raise_for_status()
        host, port = url.removeprefix("http://").split(":")
        raw = json.dumps({"messages": [USER]}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /sessions/paused/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(raw) + raw
            )
            _wait_for("the call to wait for the resume", lambda: _pause_state(url) == 1)
        _wait_for("the call to stop waiting", lambda: _pause_state(url) == 0)
        httpx.post(f"{url}/v1/rollout/resume", json={"reason": "test"}).raise_for_status()
        assert _stats(url, "paused")["steps"] == 0
    assert not [s for s in engine.seen if s.path == "/generate"], "nothing was generated"


def _pause_state(url: str) -> int:
    return int(httpx.get(f"{url}/v1/rollout/pause_state").json()["waiting_calls"])


def _trajectory(url: str, session: str = "gone") -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{url}/v1/sessions/{session}/trajectory").json()
    return answer


def _stats(url: str, session: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{url}/v1/sessions/{session}/stats").json()
    return answer


_ARGS = SimpleNamespace(
    max_tokens_per_gpu=None, context_parallel_size=1, mask_offpolicy_in_partial_rollout=False
)


def test_a_stopped_watch_ends_with_the_response_uncancelled_and_sets_nothing() -> None:
    """stop() does not cancel the watch (a cancelled task is a reference cycle per call): the
    watch ends when the server's receive() says the response is complete, and that is not a
    disconnect of the call's client. With the cyclic collector off, the watch and its task are
    freed as soon as the last reference goes: neither is in a cycle. (Counting what a collection
    finds would count the garbage of everything else running in this process too.)"""
    import asyncio
    import gc
    import weakref

    from dressage.proxy.chat_routes import ClientWatch

    async def run() -> tuple[bool, bool, list[weakref.ref[Any]]]:
        complete = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await complete.wait()  # as uvicorn's receive() once the body is read
            return {"type": "http.disconnect"}

        watch = ClientWatch(receive)
        await asyncio.sleep(0)
        watch.stop()
        complete.set()  # the response is sent
        await watch._task
        refs = [weakref.ref(watch), weakref.ref(watch._task)]
        return watch.gone.is_set(), watch._task.cancelled(), refs

    gc.collect()
    gc.disable()
    try:
        gone, cancelled, refs = asyncio.run(run())
        alive = [ref() for ref in refs]
    finally:
        gc.enable()
    assert not gone and not cancelled
    assert alive == [None, None], f"held in a reference cycle: {alive}"


def test_a_watch_sees_the_client_leave_before_it_is_stopped() -> None:
    import asyncio

    from dressage.proxy.chat_routes import ClientWatch

    async def run() -> bool:
        left = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await left.wait()
            return {"type": "http.disconnect"}

        watch = ClientWatch(receive)
        left.set()
        await asyncio.wait_for(watch.gone.wait(), 5)
        watch.stop()
        return watch.gone.is_set()

    assert asyncio.run(run())


def test_a_watch_under_the_proxys_server_starts_no_task_and_is_called_back() -> None:
    """Under the proxy's own server the scope carries disconnect hooks: the watch registers
    one instead of starting a task; a disconnect after stop() is not the call's."""
    import asyncio

    from dressage.proxy.chat_routes import ClientWatch
    from dressage.proxy.serving import DISCONNECT_HOOKS

    async def never() -> dict[str, Any]:
        raise AssertionError("receive() is not awaited when the server calls back")

    async def run() -> tuple[bool, bool, bool]:
        hooks: list[Callable[[], None]] = []
        scope = {"type": "http", "extensions": {DISCONNECT_HOOKS: hooks}}
        watch = ClientWatch(never, scope)
        tasks_started = watch._task is not None
        (hook,) = hooks
        hook()
        left = watch.gone.is_set()
        stopped = ClientWatch(never, {"type": "http", "extensions": {DISCONNECT_HOOKS: hooks}})
        stopped.stop()
        hooks[-1]()
        return tasks_started, left, stopped.gone.is_set()

    assert asyncio.run(run()) == (False, True, False)
