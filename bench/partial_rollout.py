"""What partial rollout buys: pause/resume latency, and agent steps per minute across updates.

The real embedded engine (tiny model, its own process) behind the recording proxy (this
process); agents are loops of multi-turn OpenAI chat calls (4 turns a session, then a fresh
session) whose answers run to their ``max_tokens``, drawn per call from [mean/4, 7 mean/4] as
agents' answers vary (the same draws in both modes).

1. Latency at 1, 32 and 128 calls in flight: ``POST /v1/rollout/pause`` from request to every
   call stopped with its partial output parked (the proxy's ``latency_s``, and the client's
   round trip), then ``POST /v1/rollout/resume`` to every parked call re-issued. Median of 3.
2. Throughput across repeated weight updates: agents run for a fixed time while a controller
   pauses, loads new weights from disk (``/update_weights_from_disk``, alternating two
   checkpoints) and resumes, every ``--update-interval`` seconds. ``ours``: the proxy with
   ``--dressage-partial-rollout`` (a paused call continues from prompt + partial output);
   ``baseline``: without it (the call is re-issued from its prompt, its partial output thrown
   away: slime's abort-and-restart). Both see the same engine, agents and update schedule.

    python bench/partial_rollout.py      # about 3 minutes on 2 cores; the last line is JSON

Target: ours / baseline >= 1.2 agent steps per minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import torch

from dressage.assets import load_tokenizer
from dressage.config.proxy import ProxyConfig
from dressage.engine.testing import serve_engine
from dressage.proxy.client import ProxyClient
from dressage.proxy.engine_answers import parse_version
from dressage.proxy.testing import serve_proxy
from dressage.proxy.tito import create_tito_tokenizer
from dressage.tiny import tiny_model_dir

ADMIN = "bench-admin-key-123"
ENGINE_KEY = "bench-engine-key-123"
LEVELS = {1: 256, 32: 96, 128: 48}
"""Calls in flight -> their max_tokens (long enough to still run when the pause comes)."""
TARGET = 1.2
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}


def _checkpoints(root: Path) -> list[Path]:
    from transformers import AutoModelForCausalLM

    out = []
    for k in range(2):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(k)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        model.save_pretrained(root / f"w{k}")
        out.append(root / f"w{k}")
    return out


async def _chat(http: httpx.AsyncClient, session: str, messages: list[Any], max_tokens: int) -> str:
    """One OpenAI chat call, as an agent's SDK sends it (raw JSON: the load generator shares
    this process's CPU with the proxy, so it stays as light as it can)."""
    body = {
        "model": "dressage",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        **NO_THINK,
    }
    response = await http.post(f"/sessions/{session}/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"session {session}: HTTP {response.status_code}: {response.text}")
    content = response.json()["choices"][0]["message"]["content"]
    return str(content or "")


def _agent_client(proxy: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.AsyncClient(base_url=proxy, timeout=600, limits=limits, headers=headers)


async def _latency(proxy: str, level: int, rep: int, max_tokens: int) -> dict[str, float]:
    admin = ProxyClient(proxy, admin_key=ADMIN)
    http = _agent_client(proxy)
    prompt = [{"role": "user", "content": "Count."}]
    calls = [
        asyncio.create_task(_chat(http, f"lat-{level}-{rep}-{i}", prompt, max_tokens))
        for i in range(level)
    ]
    while (await admin.pause_state())["in_flight"] < level:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # every call has produced tokens
    started = time.perf_counter()
    paused = await admin.pause_rollout(f"latency {level}")
    pause_rt = time.perf_counter() - started
    started = time.perf_counter()
    resumed = await admin.resume_rollout(reason=f"latency {level}")
    resume_rt = time.perf_counter() - started
    await asyncio.gather(*calls)
    await admin.aclose()
    await http.aclose()
    return {
        "paused_calls": paused["paused_calls"],
        "pause_s": paused["latency_s"],
        "pause_rt_s": pause_rt,
        "resume_s": resumed["latency_s"],
        "resume_rt_s": resume_rt,
    }


async def _throughput(
    proxy: str,
    engine_url: str,
    weights: list[Path],
    *,
    agents: int,
    seconds: float,
    interval: float,
    max_tokens: int,
    tag: str,
) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    done: list[float] = []
    admin = ProxyClient(proxy, admin_key=ADMIN)
    http = httpx.AsyncClient(timeout=120, headers={"authorization": f"Bearer {ENGINE_KEY}"})
    agents_http = _agent_client(proxy)
    version = parse_version((await http.get(f"{engine_url}/model_info")).json()["weight_version"])

    async def agent(i: int) -> None:
        lengths = random.Random(i)  # the same answer lengths in both modes
        session_no = 0
        while time.monotonic() < stop:
            session = f"{tag}-{i}-{session_no}"
            messages: list[Any] = [{"role": "user", "content": f"Agent {i}: work."}]
            for turn in range(4):
                budget = lengths.randint(max_tokens // 4, max_tokens * 7 // 4)
                content = await _chat(agents_http, session, messages, budget)
                if time.monotonic() >= stop:
                    return
                done.append(time.monotonic())
                messages += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": f"next {turn}"},
                ]
            await admin.finalize_session(session)
            session_no += 1

    async def controller() -> int:
        nonlocal version
        updates = 0
        while time.monotonic() + interval < stop:
            await asyncio.sleep(interval)
            await admin.pause_rollout(f"update {updates}")
            body = {"model_path": str(weights[updates % 2]), "weight_version": str(version + 1)}
            response = await http.post(f"{engine_url}/update_weights_from_disk", json=body)
            response.raise_for_status()
            version += 1
            await admin.resume_rollout(version, f"update {updates}")
            updates += 1
        return updates

    started = time.monotonic()
    updates, *_ = await asyncio.gather(controller(), *(agent(i) for i in range(agents)))
    elapsed = time.monotonic() - started
    stats = await admin.stats()
    await admin.aclose()
    await http.aclose()
    await agents_http.aclose()
    return {
        "steps": len(done),
        "steps_per_min": len(done) / elapsed * 60,
        "updates": updates,
        "paused_calls": stats["counters"].get("paused_calls", 0),
        "discarded_tokens": stats["counters"].get("discarded_tokens", 0),
    }


def _proxy(engine_url: str, store: Path, tito: Any, partial: bool) -> Any:
    config = ProxyConfig(
        engine_url=engine_url,
        store_dir=store,
        admin_key=ADMIN,
        engine_admin_key=ENGINE_KEY,
        partial_rollout=partial,
        record_token_versions=True,
        max_pauses_per_trajectory=0,
        pause_timeout_s=120,
    )
    return serve_proxy(config, tito=tito)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="partial rollout vs restart-from-scratch")
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--seconds", type=float, default=45.0, help="throughput run per mode")
    p.add_argument("--update-interval", type=float, default=6.0)
    p.add_argument("--max-tokens", type=int, default=64, help="mean tokens per agent step")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    tito = create_tito_tokenizer(load_tokenizer("qwen3.5"), "qwen3.5")
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pr-")))
        weights = _checkpoints(root)
        engine_url = stack.enter_context(
            serve_engine(
                tiny_model_dir(),
                subprocess=True,
                device="cpu",
                num_threads=1,
                context_length=4096,
                max_running_requests=160,
                admin_api_key=ENGINE_KEY,
            )
        )
        latency: dict[int, dict[str, float]] = {}
        with _proxy(engine_url, root / "store-latency", tito, True) as proxy:
            for level, max_tokens in LEVELS.items():
                runs = [
                    asyncio.run(_latency(proxy, level, r, max_tokens)) for r in range(args.reps)
                ]
                latency[level] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                print(f"in flight {level:4d}: {latency[level]}", flush=True)
        results = {}
        for name, partial in (("baseline", False), ("ours", True)):
            with _proxy(engine_url, root / f"store-{name}", tito, partial) as proxy:
                results[name] = asyncio.run(
                    _throughput(
                        proxy,
                        engine_url,
                        weights,
                        agents=args.agents,
                        seconds=args.seconds,
                        interval=args.update_interval,
                        max_tokens=args.max_tokens,
                        tag=name,
                    )
                )
            print(f"{name:8s}: {results[name]}", flush=True)
    ours, baseline = results["ours"]["steps_per_min"], results["baseline"]["steps_per_min"]
    ratio = ours / baseline if baseline else float("inf")
    print(
        f"agent steps/min across weight updates: restart {baseline:.1f}, partial {ours:.1f}, "
        f"ratio {ratio:.2f}x (target {TARGET}x)"
    )
    summary = {
        "metric": "agent_steps_per_minute_across_weight_updates",
        "unit": "steps/min",
        "baseline": round(baseline, 2),
        "ours": round(ours, 2),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "met": ratio >= TARGET,
        "update_interval_s": args.update_interval,
        "updates": {k: v["updates"] for k, v in results.items()},
        "pause_latency_s": {str(k): round(v["pause_s"], 4) for k, v in latency.items()},
        "resume_latency_s": {str(k): round(v["resume_s"], 4) for k, v in latency.items()},
        "paused_calls": {str(k): v["paused_calls"] for k, v in latency.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
