"""Embedded engine: decode throughput at concurrency 1, 8 and 32, and pause latency at 32.

The engine runs in a child process (``dressage engine serve``), the client here: closed-loop
workers each send ``/generate`` (random 32-token prompts, temperature 1, ``ignore_eos``,
``return_logprob``, 32 to 96 new tokens, 64 on average) and send the next request as soon as one
returns. tokens/s is the engine's count of generated tokens (``/v1/loads``
``generated_tokens_total``) over a steady-state window after a warm-up, while the clients keep
the loop full.

Pause latency: with 32 requests decoding, ``/pause_generation {"mode": "abort"}`` is sent at a
random moment; the latency is from sending it until the call returns, which the engine does once
every in-flight request has been stopped at a token boundary and released (each of the 32 is
then checked to have finished with ``abort``). Target: p99 <= one decode step at batch 32 + 20
ms (the step is the engine's own average decode step with those 32 in flight, read from
``/v1/loads`` just before each pause; median over the trials). Also
reported: until the last of the 32 answers has reached this client, and the retract / in_place
pause calls.

    python bench/engine.py                                   # tiny model, CPU, about 3 minutes
    python bench/engine.py --device cuda --model PATH        # on a GPU machine
    DRESSAGE_ENGINE_ADMIN_KEY=K python bench/engine.py --url URL   # an engine already running

The last line is the JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import sys
import time
from typing import Any

import httpx

from dressage.engine.testing import serve_engine

ENGINE_KEY = os.environ.get("DRESSAGE_ENGINE_ADMIN_KEY") or secrets.token_urlsafe(16)
"""The control key: the given engine's (``--url``), or one for the engine started here."""


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="HF model folder (default: the tiny test model)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--seconds", type=float, default=15.0, help="measured time per level")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds before measuring")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64, help="mean; drawn from [n/2, 3n/2]")
    p.add_argument("--pause-trials", type=int, default=20)
    p.add_argument("--num-threads", type=int)
    p.add_argument("--url", help="measure an already running engine instead of starting one")
    return p.parse_args(argv)


def _body(
    rng: random.Random, args: argparse.Namespace, vocab: int, **sampling: Any
) -> dict[str, Any]:
    return {
        "input_ids": [rng.randrange(1000, vocab) for _ in range(args.prompt_len)],
        "sampling_params": {
            # Lengths vary (mean --max-new-tokens) as rollouts do; at concurrency 1 this changes
            # nothing, at 32 requests finish at different steps and others take their slots.
            "max_new_tokens": rng.randint(args.max_new_tokens // 2, args.max_new_tokens * 3 // 2),
            "temperature": 1.0,
            "ignore_eos": True,
        }
        | sampling,
        "return_logprob": True,
    }


async def _throughput(url: str, args: argparse.Namespace, concurrency: int, vocab: int) -> float:
    """Closed loop at ``concurrency``; the rate is the engine's count of generated tokens over a
    steady-state window (after a warm-up, before the workers stop), so neither partial requests
    nor the ramp-up and drain at the ends distort it."""
    rng = random.Random(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            while not stop.is_set():
                r = await client.post(f"{url}/generate", json=_body(rng, args, vocab))
                r.raise_for_status()

        async def generated() -> tuple[float, int]:
            load = (await client.get(f"{url}/v1/loads")).json()["loads"][0]
            return time.monotonic(), int(load["generated_tokens_total"])

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(args.warmup)
        t0, n0 = await generated()
        await asyncio.sleep(args.seconds)
        t1, n1 = await generated()
        stop.set()
        await asyncio.gather(*workers)
    return (n1 - n0) / (t1 - t0)


async def _pause_trial(
    client: httpx.AsyncClient, url: str, args: argparse.Namespace, vocab: int, mode: str, seed: int
) -> tuple[float, float, float]:
    """-> (ms until the pause call returned, ms until the last in-flight answer arrived, the
    engine's recent decode step in ms with these 32 in flight)."""
    rng = random.Random(seed)
    in_flight = 32
    bodies = [_body(rng, args, vocab, max_new_tokens=4000) for _ in range(in_flight)]
    tasks = [asyncio.create_task(client.post(f"{url}/generate", json=b)) for b in bodies]
    deadline = time.monotonic() + 60
    while True:  # wait until all 32 decode together
        load = (await client.get(f"{url}/v1/loads")).json()["loads"][0]
        if load["num_running_reqs"] == in_flight:
            break
        early = [t for t in tasks if t.done()]
        if early or time.monotonic() > deadline:
            detail = early[0].result().text[:300] if early else load
            raise RuntimeError(f"the {in_flight} pause-trial requests did not all start: {detail}")
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2 + rng.random() * 0.3)
    load = (await client.get(f"{url}/v1/loads")).json()["loads"][0]
    step_ms = float(load["decode_step_ms_avg"])
    sent = time.monotonic()
    pause = await client.post(f"{url}/pause_generation", json={"mode": mode})
    pause.raise_for_status()
    paused = time.monotonic()  # the engine has stopped every in-flight request by now
    if mode == "abort":
        finished = await asyncio.gather(*tasks)
        answered = time.monotonic()
        for r in finished:
            assert r.json()["meta_info"]["finish_reason"]["type"] == "abort", r.text[:200]
        await client.post(f"{url}/continue_generation", json={})
    else:
        answered = paused
        await client.post(f"{url}/continue_generation", json={})
        await client.post(f"{url}/abort_request", json={"abort_all": True})
        await asyncio.gather(*tasks)
    return (paused - sent) * 1000.0, (answered - sent) * 1000.0, step_ms


async def _pause_latencies(
    url: str, args: argparse.Namespace, vocab: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "abort": [], "abort_answers": [], "step": [], "retract": [], "in_place": []
    }  # fmt: skip
    limits = httpx.Limits(max_connections=64)
    headers = {"authorization": f"Bearer {ENGINE_KEY}"}  # pause and abort are control routes
    async with httpx.AsyncClient(timeout=600, limits=limits, headers=headers) as client:
        for trial in range(args.pause_trials):
            stopped, answered, step = await _pause_trial(client, url, args, vocab, "abort", trial)
            out["abort"].append(stopped)
            out["abort_answers"].append(answered)
            out["step"].append(step)
        for mode in ("retract", "in_place"):
            for trial in range(max(3, args.pause_trials // 4)):
                stopped, _, _ = await _pause_trial(client, url, args, vocab, mode, 1000 + trial)
                out[mode].append(stopped)
    return out


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def _run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    info = httpx.get(f"{url}/server_info", timeout=30).json()
    vocab = int(info["vocab_size"])
    levels = [int(c) for c in args.concurrency.split(",")]
    tps: dict[int, float] = {}
    for c in levels:
        tps[c] = asyncio.run(_throughput(url, args, c, vocab))
        load = httpx.get(f"{url}/v1/loads", timeout=30).json()["loads"][0]
        print(
            f"concurrency {c:>3}: {tps[c]:8.1f} tokens/s (engine: last 64 decode steps "
            f"{load['decode_step_ms_avg']:.1f} ms on average)",
            flush=True,
        )
    pauses = asyncio.run(_pause_latencies(url, args, vocab))
    return {"tps": tps, "pauses": pauses, "device": info.get("device"), "levels": levels}


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    if args.url:
        result = _run(args.url, args)
    else:
        from dressage.tiny import tiny_model_dir

        model = args.model or str(tiny_model_dir())
        options: dict[str, Any] = {"device": args.device}
        if args.num_threads:
            options["num_threads"] = args.num_threads
        with serve_engine(model, subprocess=True, admin_api_key=ENGINE_KEY, **options) as url:
            result = _run(url, args)
    tps, pauses = result["tps"], result["pauses"]
    base, top = tps[min(tps)], tps[max(tps)]
    ratio = top / base
    step_ms = statistics.median(pauses["step"])  # the engine's decode step with 32 in flight
    abort = pauses["abort"]
    p99, target_ms = _p99(abort), step_ms + 20.0
    print(
        f"decode step with 32 in flight: {step_ms:.1f} ms; pause(abort) p50 "
        f"{statistics.median(abort):.1f} ms, p99 {p99:.1f} ms (target <= {target_ms:.1f} ms), "
        f"last answer at the client p50 {statistics.median(pauses['abort_answers']):.1f} ms, "
        f"p99 {_p99(pauses['abort_answers']):.1f} ms; "
        f"retract p50 {statistics.median(pauses['retract']):.1f} ms, in_place p50 "
        f"{statistics.median(pauses['in_place']):.1f} ms; device {result['device']}; "
        f"{time.monotonic() - started:.0f} s"
    )
    throughput_met, pause_met = ratio >= 8.0, p99 <= target_ms
    summary = {
        "metric": f"aggregate decode tokens/s, concurrency {max(tps)} vs {min(tps)}",
        "unit": "tokens/s",
        "baseline": round(base, 1),
        "ours": round(top, 1),
        "ratio": round(ratio, 2),
        "target": 8.0,
        "met": throughput_met and pause_met,
        "throughput_met": throughput_met,
        "tokens_per_s": {str(c): round(v, 1) for c, v in tps.items()},
        "decode_step_ms_32": round(step_ms, 2),
        "pause_abort_p50_ms": round(statistics.median(abort), 2),
        "pause_abort_p99_ms": round(p99, 2),
        "pause_target_ms": round(target_ms, 2),
        "pause_abort_answers_p99_ms": round(_p99(pauses["abort_answers"]), 2),
        "pause_met": pause_met,
        "pause_retract_p50_ms": round(statistics.median(pauses["retract"]), 2),
        "pause_in_place_p50_ms": round(statistics.median(pauses["in_place"]), 2),
        "device": result["device"],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
