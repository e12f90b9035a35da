"""The batching loop without HTTP: slots are shared, compacted and budgeted without changing
what any request produces."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from dressage.engine.model_runner import ModelRunner
from dressage.engine.request import Request
from dressage.engine.sampling import SamplingParams
from dressage.engine.scheduler import Scheduler, SchedulerLimits
from tests.engine.engine_oracle import greedy_reference

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path) -> ModelRunner:
    return ModelRunner(tiny_model_path, device="cpu", cpu_workers=2)


def _run(
    runner: ModelRunner, limits: SchedulerLimits, jobs: list[tuple[list[int], int]]
) -> tuple[list[Request], list[dict[str, Any]]]:
    done = threading.Event()
    loads: list[dict[str, Any]] = []
    reqs = [
        Request(
            rid=f"r{i}",
            prompt_ids=prompt,
            params=SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True),
            max_new_tokens=n,
        )
        for i, (prompt, n) in enumerate(jobs)
    ]

    def progress(batch: list[Request]) -> None:  # runs on the scheduler thread
        running = scheduler.running
        loads.append(
            {
                "running": len(running),
                "waiting": len(scheduler.waiting),
                "padded_kv": len(running) * max((r.reserved_tokens for r in running), default=0),
            }
        )
        if all(r.finished for r in reqs):
            done.set()

    scheduler = Scheduler(runner, limits, weight_version="w", on_progress=progress)
    scheduler.start()
    try:
        for req in reqs:
            scheduler.submit(req)
        assert done.wait(120)
    finally:
        scheduler.stop()
    return reqs, loads


def test_budgeted_slots_and_compaction_keep_outputs_exact(
    runner: ModelRunner, reference_model: Any
) -> None:
    rng = random.Random(3)
    jobs = [
        ([rng.randrange(1000, 200_000) for _ in range(3 + 4 * i)], 5 + 7 * (i % 4))
        for i in range(9)
    ]
    # Every slot is padded to the longest reservation (up to 35 + 26 = 61 positions); the budget
    # fits three of those, so requests must wait for others to leave.
    limits = SchedulerLimits(max_running=8, max_total_tokens=3 * 61, max_prefill_tokens=20)
    reqs, loads = _run(runner, limits, jobs)
    assert all(load["padded_kv"] <= limits.max_total_tokens for load in loads)
    assert any(load["waiting"] > 0 for load in loads) and max(load["running"] for load in loads) > 1
    for req, (prompt, n) in zip(reqs, jobs, strict=True):
        assert req.finish is not None and req.finish.type == "length"
        assert req.output_ids == greedy_reference(reference_model, prompt, n), req.rid
        assert req.weight_spans == [["w", 0, n]]
    assert runner.cache.slots * runner.cache.capacity <= max(limits.max_total_tokens, 8 * 256)


def test_a_failing_step_fails_its_batch_not_the_loop(
    runner: ModelRunner, reference_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_decode = runner.decode
    calls = {"n": 0}

    def flaky(tokens: list[int], positions: list[int]) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected fault")
        return real_decode(tokens, positions)

    monkeypatch.setattr(runner, "decode", flaky)
    limits = SchedulerLimits(max_running=4, max_total_tokens=4096, max_prefill_tokens=256)
    prompt = [5000, 6000, 7000]
    (broken,), _ = _run(runner, limits, [(prompt, 6)])
    assert broken.finish is not None and broken.finish.type == "abort"
    assert broken.finish.status_code == 500 and "injected fault" in (broken.finish.message or "")
    assert len(broken.output_ids) == len(broken.output_logprobs) == 2  # prefill + first decode
    (healthy,), _ = _run(runner, limits, [(prompt, 6)])
    assert healthy.output_ids == greedy_reference(reference_model, prompt, 6)


def test_many_requests_admitted_at_once_grow_the_cache(
    runner: ModelRunner, reference_model: Any
) -> None:
    """20 arrivals while 3 decode: one step admits more slots than the cache holds."""
    rng = random.Random(5)
    jobs = [
        ([rng.randrange(1000, 200_000) for _ in range(4 + i % 5)], 3 + i % 4) for i in range(23)
    ]
    limits = SchedulerLimits(max_running=32, max_total_tokens=1 << 16, max_prefill_tokens=4096)
    reqs, loads = _run(runner, limits, jobs)
    assert max(load["running"] for load in loads) > 8  # past the cache's initial 8 slots
    for req, (prompt, n) in zip(reqs, jobs, strict=True):
        assert req.output_ids == greedy_reference(reference_model, prompt, n), req.rid
