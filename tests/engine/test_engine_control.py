"""Abort and pause/continue against a real engine: token-boundary semantics, nothing lost."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.engine_oracle import full_forward_logprobs, greedy_reference
from tests.helpers import ENGINE_KEY, bearer

pytestmark = pytest.mark.integration

LONG = {"max_new_tokens": 900, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(tiny_model_path: Path) -> Iterator[str]:
    from dressage.engine.testing import serve_engine

    # Two lm_head workers here: the control paths also run over the sharded vocabulary pass.
    with serve_engine(
        tiny_model_path, device="cpu", num_threads=2, context_length=1024, admin_api_key=ENGINE_KEY
    ) as url:
        yield url


def _prompt(seed: int, n: int = 10) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 200_000) for _ in range(n)]


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120, headers=bearer(ENGINE_KEY))


def _loads(url: str) -> dict[str, Any]:
    load: dict[str, Any] = httpx.get(f"{url}/v1/loads").json()["loads"][0]
    return load


def _wait(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


class _Stream:
    """A streaming /generate on a thread; records every chunk it sees."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        with httpx.stream(
            "POST", f"{url}/generate", json=body | {"stream": True}, timeout=300
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.chunks.append(json.loads(line[6:]))
        self.done.set()

    def final(self, timeout: float = 120) -> dict[str, Any]:
        assert self.done.wait(timeout), "stream did not finish"
        return self.chunks[-1]


def _submit(url: str, body: dict[str, Any]) -> Future[httpx.Response]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(_post, url, "/generate", body)
    pool.shutdown(wait=False)
    return future


def test_abort_by_rid_returns_partial_output(url: str) -> None:
    stream = _Stream(
        url,
        {
            "input_ids": _prompt(1),
            "rid": "victim-1",
            "sampling_params": LONG,
            "return_logprob": True,
        },
    )
    other = _submit(
        url,
        {
            "input_ids": _prompt(2),
            "rid": "bystander",
            "sampling_params": LONG | {"max_new_tokens": 40},
        },
    )
    _wait(lambda: len(stream.chunks) >= 5)
    assert _post(url, "/abort_request", {"rid": "victim"}).status_code == 200  # prefix match
    final = stream.final()
    meta = final["meta_info"]
    assert meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 5 <= len(final["output_ids"]) < 900
    assert (
        len(meta["output_token_logprobs"]) == len(final["output_ids"]) == meta["completion_tokens"]
    )
    assert (
        final["output_ids"][: len(stream.chunks[0]["output_ids"])] == stream.chunks[0]["output_ids"]
    )
    survivor = other.result(timeout=120).json()
    assert survivor["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_unknown_rid_is_a_noop_and_abort_all_stops_everything(url: str) -> None:
    assert _post(url, "/abort_request", {"rid": "no-such-request"}).status_code == 200
    futures = [
        _submit(url, {"input_ids": _prompt(10 + i), "sampling_params": LONG}) for i in range(4)
    ]
    _wait(lambda: _loads(url)["num_running_reqs"] == 4)
    r = _post(url, "/abort_request", {"abort_all": True})
    assert r.status_code == 200 and r.content == b""
    for f in futures:
        out = f.result(timeout=60).json()
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(out["output_ids"]) < 900
    _wait(lambda: _loads(url)["num_running_reqs"] == 0)


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_and_continue_lose_and_duplicate_nothing(
    url: str, reference_model: Any, mode: str
) -> None:
    prompt = _prompt(20)
    params = {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}
    stream = _Stream(url, {"input_ids": prompt, "sampling_params": params, "return_logprob": True})
    _wait(lambda: len(stream.chunks) >= 3)
    r = _post(url, "/pause_generation", {"mode": mode})
    assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    load = _loads(url)
    assert load["paused"] == mode
    if mode == "retract":
        assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 1)
    else:
        assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (1, 0)
    seen = len(stream.chunks)
    time.sleep(0.3)
    assert len(stream.chunks) == seen and not stream.done.is_set()  # nothing steps while paused
    waiter = _submit(url, {"input_ids": _prompt(21), "sampling_params": {"max_new_tokens": 3}})
    time.sleep(0.3)
    assert not waiter.done()  # new requests wait while paused, they are not refused
    r = _post(url, "/continue_generation", {})
    assert r.json() == {"message": "Generation continued successfully.", "status": "ok"}
    final = stream.final()
    assert 0 < seen < 60  # the pause really fell in the middle
    assert final["output_ids"] == greedy_reference(reference_model, prompt, 60)
    assert final["meta_info"]["num_retractions"] == (1 if mode == "retract" else 0)
    assert len(final["meta_info"]["output_token_logprobs"]) == 60
    assert waiter.result(timeout=60).status_code == 200


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_sampled_request_across_a_pause_stays_consistent(
    url: str, reference_model: Any, mode: str
) -> None:
    """Sampling (T = 1, seeded) across a pause: what was streamed before the pause is kept as
    is, and every logprob still matches one full forward over the final sequence."""
    prompt = _prompt(22)
    params = {"max_new_tokens": 40, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True}
    stream = _Stream(url, {"input_ids": prompt, "sampling_params": params, "return_logprob": True})
    _wait(lambda: len(stream.chunks) >= 3)
    _post(url, "/pause_generation", {"mode": mode})
    before = stream.chunks[-1]["output_ids"]
    _post(url, "/continue_generation", {})
    final = stream.final()
    assert final["output_ids"][: len(before)] == before and len(final["output_ids"]) == 40
    got = [e[0] for e in final["meta_info"]["output_token_logprobs"]]
    want = full_forward_logprobs(reference_model, prompt, final["output_ids"])
    assert got == pytest.approx(want, abs=1e-4)


def test_pause_abort_mode_returns_after_everything_stopped(url: str) -> None:
    futures = [
        _submit(url, {"input_ids": _prompt(30 + i), "sampling_params": LONG}) for i in range(3)
    ]
    _wait(lambda: _loads(url)["num_running_reqs"] == 3)
    assert _post(url, "/pause_generation", {}).status_code == 200  # default mode is abort
    for f in futures:  # the server answered them all before the pause call returned
        assert f.result(timeout=5).json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert _loads(url)["num_running_reqs"] == 0
    late = _submit(url, {"input_ids": _prompt(40), "sampling_params": {"max_new_tokens": 2}})
    time.sleep(0.3)
    assert not late.done()
    _post(url, "/continue_generation", {})
    assert late.result(timeout=60).json()["meta_info"]["finish_reason"]["type"] == "length"


def test_flush_cache_only_when_idle(url: str) -> None:
    assert httpx.get(f"{url}/flush_cache", headers=bearer(ENGINE_KEY)).status_code == 200
    stream = _Stream(url, {"input_ids": _prompt(50), "sampling_params": LONG})
    _wait(lambda: len(stream.chunks) >= 2)
    busy = httpx.post(f"{url}/flush_cache", headers=bearer(ENGINE_KEY))
    assert busy.status_code == 400 and "running" in busy.text
    _post(url, "/abort_request", {"abort_all": True})
    stream.final()
    flushed = httpx.post(f"{url}/flush_cache", headers=bearer(ENGINE_KEY))
    assert flushed.text.startswith("Cache flushed.")


def test_duplicate_live_rid_is_refused(url: str) -> None:
    stream = _Stream(url, {"input_ids": _prompt(60), "rid": "dup", "sampling_params": LONG})
    _wait(lambda: len(stream.chunks) >= 1)
    r = _post(url, "/generate", {"input_ids": _prompt(61), "rid": "dup"})
    assert r.status_code == 400 and r.json() == {
        "error": {"message": "Duplicate request ID detected: dup"}
    }
    _post(url, "/abort_request", {"rid": "dup"})
    assert stream.final()["meta_info"]["finish_reason"]["type"] == "abort"


def test_client_disconnect_aborts_the_request(url: str) -> None:
    with httpx.stream(
        "POST",
        f"{url}/generate",
        json={"input_ids": _prompt(70), "stream": True, "sampling_params": LONG},
        timeout=60,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
    _wait(lambda: _loads(url)["num_running_reqs"] == 0, timeout=15)


def test_health_and_loads(url: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/health_generate").status_code == 200
    assert httpx.get(f"{url}/v1/loads", params={"include": "core,queues"}).status_code == 200
    assert httpx.get(f"{url}/v1/loads", params={"include": "nope"}).status_code == 400
    legacy = httpx.get(f"{url}/get_load").json()
    assert legacy[0]["dp_rank"] == 0 and "num_tokens" in legacy[0]
    info = httpx.get(f"{url}/server_info").json()
    assert info["context_length"] == 1024 and info["weight_version"] == "default"
