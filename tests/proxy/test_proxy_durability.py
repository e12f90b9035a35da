"""Durability: ``kill -9`` of a proxy process, then a restart on the same store.

Every acknowledged step and finalized segment reads back; open sessions can still be finalized,
or go on (in a new segment, ``boundary_reason="proxy_restarted"``); a call in flight at the
crash leaves nothing behind. The proxy runs as ``python -m dressage.proxy.server`` in front of
the real embedded engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import APIConnectionError, OpenAI

from dressage.proxy.client import SyncProxyClient
from dressage.proxy.server import READY_PREFIX
from tests.helpers import ENGINE_KEY, REPO

pytestmark = pytest.mark.integration

ADMIN = "durable-admin-key"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@contextmanager
def proxy_process(engine_url: str, store: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    argv = [sys.executable, "-m", "dressage.proxy.server", "--engine-url", engine_url]
    argv += [
        "--port",
        "0",
        "--store-dir",
        str(store),
        "--admin-key",
        ADMIN,
        "--engine-retries",
        "0",
    ]
    # The engine's control key through the variable the engine itself reads (for aborts).
    env = dict(os.environ, PYTHONPATH=str(REPO), DRESSAGE_ENGINE_ADMIN_KEY=ENGINE_KEY)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                url = line[len(READY_PREFIX) :].strip()
                break
        assert url.startswith("http://127.0.0.1:"), f"proxy did not start (exit {proc.poll()})"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


class Agent:
    def __init__(self, url: str, session: str) -> None:
        self.client = OpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": f"Hi, {session}."}]

    def call(self, max_tokens: int = 5) -> None:
        response = self.client.chat.completions.create(
            model="tiny", messages=self.messages, max_tokens=max_tokens,  # type: ignore[arg-type]
            temperature=0, extra_body=NO_THINK,
        )  # fmt: skip
        self.messages.append(response.choices[0].message.model_dump(exclude_none=True))
        self.messages.append({"role": "user", "content": f"More ({len(self.messages)})."})

    def at(self, url: str, session: str) -> Agent:
        self.client = OpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0)
        return self


def _dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [item.to_dict() for item in items]


def test_kill_9_and_restart_loses_nothing_acknowledged(engine_url: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    with proxy_process(engine_url, store) as (proc, url):
        admin = SyncProxyClient(url, admin_key=ADMIN)
        done = Agent(url, "done")
        done.call()
        done.call()
        finalized = _dicts(admin.finalize_session("done"))

        still_open = Agent(url, "open")
        still_open.call()
        still_open.call()

        compacted = Agent(url, "cmp")
        compacted.call()
        compacted.call()
        compacted.messages[:] = [{"role": "user", "content": "Summary: we talked. Go on."}]
        compacted.call()

        inflight = Agent(url, "inflight")
        inflight.call()
        failure: list[BaseException] = []

        def long_call() -> None:
            try:
                inflight.call(max_tokens=1000)
            except APIConnectionError as exc:
                failure.append(exc)

        before = {s: _dicts(admin.read_trajectory(s).steps) for s in ("open", "cmp", "inflight")}
        thread = threading.Thread(target=long_call)
        thread.start()
        _wait_generating(engine_url)
        os.kill(proc.pid, signal.SIGKILL)  # right after acknowledged answers, mid-call for one
        proc.wait(timeout=30)
        thread.join(timeout=60)
        assert failure, "the in-flight call should have lost its connection"

    with proxy_process(engine_url, store) as (_, url):
        admin = SyncProxyClient(url, admin_key=ADMIN)
        stats = admin.stats()
        assert stats["store"]["torn_tail_bytes"] == 0 and stats["store"]["skipped_corrupt"] == 0
        # finalized segments read back, and finalizing again changes nothing
        assert _dicts(admin.read_trajectory("done").segments) == finalized
        assert _dicts(admin.finalize_session("done")) == finalized
        # acknowledged steps of open sessions read back exactly
        for session, steps in before.items():
            assert _dicts(admin.read_trajectory(session).steps) == steps, session
        # an open session can be finalized after the restart
        (segment,) = admin.finalize_session("open")
        assert segment.finish_reason == before["open"][-1]["finish_reason"]
        assert len(segment.tokens) == sum(
            len(s["prompt_delta_ids"]) + len(s["output_ids"]) for s in before["open"]
        )
        # or go on: a new segment, since the TITO state died with the process
        compacted.at(url, "cmp").call()
        steps = admin.read_trajectory("cmp").steps
        assert [(s.step_index, s.segment_index, s.boundary_reason) for s in steps] == [
            (0, 0, None),
            (1, 0, None),
            (2, 1, "messages_removed"),
            (3, 2, "proxy_restarted"),
        ]
        segments = admin.finalize_session("cmp")
        assert [s.finish_reason for s in segments] == [
            "segment_boundary",
            "segment_boundary",
            steps[-1].finish_reason,
        ]
        assert segments[1].extra_info["boundary_reason"] == "proxy_restarted"
        # the call in flight at the crash was never acknowledged: nothing of it is stored
        assert len(admin.read_trajectory("inflight").steps) == 1
        assert httpx.get(f"{url}/health").status_code == 200


def _wait_generating(engine_url: str, timeout: float = 30.0) -> None:
    """Until the engine has a request running (the long call reached it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loads = httpx.get(f"{engine_url}/v1/loads?include=core").json()["loads"][0]
        if loads["num_running_reqs"] + loads["num_waiting_reqs"] > 0:
            return
        time.sleep(0.02)
    raise TimeoutError("the long call never reached the engine")
