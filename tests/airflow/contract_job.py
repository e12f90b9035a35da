"""A small job that honours the training job's contract, to test the orchestration around it.

    DRESSAGE_JOB_MODULE=tests.airflow.contract_job python -m tests.airflow.contract_job \
        --run-config RUN.json

It is not a trainer: it checks RUN.json, the services it was given (``GET /health`` of the
engine and the proxy, the admin key in the environment, and the engine's control key: the
engine refuses a control call without it and takes it, and the proxy pauses the engine with its
own copy), then per step writes one artifact
folder (segments, samples, train_data), one metrics.jsonl record with per-teacher reverse KL and
reward (MOPD's keys) and per-task pass rate and loss (GRPO's), and a progress line; finally
summary.json and checkpoints/. Knobs in ``advanced["contract_job"]``: ``fail_at_step`` (exit
``fail_exit``, default 3, with a traceback; 2 is the real job's "cannot run", never retried),
``bad_train_data`` (positive log-probs: valid Arrow, failing pandera),
``step_sleep_s``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from dressage.schemas import samples_to_table, segments_to_table, train_data_to_table
from dressage.staging import ArtifactWriter
from dressage.trajectory import Segment
from dressage.types import Sample

REQUIRED = (
    "objective",
    "mopd_config",
    "student",
    "engine_url",
    "proxy_url",
    "output_dir",
    "num_steps",
    "seed",
    "rollout_batch_size",
    "advanced",
)


def _check_services(run: dict[str, Any]) -> None:
    if run.get("backend") == "ray" or run["proxy_url"] is None:
        return
    if len(os.environ.get("DRESSAGE_PROXY_ADMIN_KEY", "")) < 8:
        raise SystemExit("contract job: DRESSAGE_PROXY_ADMIN_KEY is not in the environment")
    for name in ("engine_url", "proxy_url"):
        status = httpx.get(f"{run[name]}/health", timeout=10).status_code
        if status != 200:
            raise SystemExit(f"contract job: {name} {run[name]} answers {status}")
        print(f"{name} healthy: {run[name]}", flush=True)
    _check_engine_key(run["engine_url"], run["proxy_url"])


def _check_engine_key(engine_url: str, proxy_url: str) -> None:
    key = os.environ.get("DRESSAGE_ENGINE_ADMIN_KEY", "")
    if len(key) < 8:
        raise SystemExit("contract job: DRESSAGE_ENGINE_ADMIN_KEY is not in the environment")
    probe = {"rid": "contract-job-probe"}
    statuses = [
        httpx.post(f"{engine_url}/abort_request", json=probe, headers=headers).status_code
        for headers in ({}, {"authorization": f"Bearer {key}"})
    ]
    if statuses != [401, 200]:
        raise SystemExit(f"contract job: engine abort_request without/with its key: {statuses}")
    admin = {"authorization": f"Bearer {os.environ['DRESSAGE_PROXY_ADMIN_KEY']}"}
    for action in ("pause", "resume"):  # the proxy pauses the engine: it holds the key too
        r = httpx.post(f"{proxy_url}/v1/rollout/{action}", json={}, headers=admin, timeout=60)
        if r.status_code != 200:
            raise SystemExit(f"contract job: proxy {action}: HTTP {r.status_code} {r.text[:300]}")
    print("engine control key checked", flush=True)


def _segments(step: int, teacher: str, n: int) -> list[Segment]:
    out = []
    for i in range(n):
        # ids inside every vocabulary a student may have (the task vocabulary has 704 rows)
        tokens = [100 + step, 200 + i, 300, 400 + i, 650]
        out.append(
            Segment(
                session_id=f"{teacher}-{step}-{i}",
                segment_index=0,
                tokens=tokens,
                full_loss_mask=[0, 0, 1, 1, 1],
                full_logprobs=[0.0, 0.0, -0.5, -0.25, -0.1],
                full_versions=[-1, -1, step, step, step],
                messages=[{"role": "user", "content": f"{teacher} prompt {i}"}],
                finish_reason="stop",
                prompt_length=2,
            )
        )
    return out


def _train_data(segments: list[Segment], teachers: list[str], bad: bool) -> dict[str, Any]:
    sign = 1.0 if bad else -1.0  # a positive log-probability breaks the data contract
    return {
        "tokens": [s.tokens for s in segments],
        "response_lengths": [3 for _ in segments],
        "rewards": [0.5 for _ in segments],
        "raw_reward": [1.0 for _ in segments],
        "truncated": [0 for _ in segments],
        "sample_indices": list(range(len(segments))),
        "rollout_ids": [0 for _ in segments],
        "loss_masks": [[1, 1, 1] for _ in segments],
        "rollout_mask_sums": [3.0 for _ in segments],
        "rollout_log_probs": [[sign * 0.5, -0.25, -0.1] for _ in segments],
        "teacher_log_probs": [[-0.4, -0.2, -0.1] for _ in segments],
        "prompt": teachers,
        "source_names": teachers,
    }


def _step(run: dict[str, Any], step: int, teachers: list[str], knobs: dict[str, Any]) -> None:
    out = Path(run["output_dir"])
    per = max(1, int(run["rollout_batch_size"]) // len(teachers))
    segments = [seg for t in teachers for seg in _segments(step, t, per)]
    owners = [t for t in teachers for _ in range(per)]
    samples = [
        Sample(index=i, tokens=s.tokens, response_length=3, status=Sample.Status.COMPLETED)
        for i, s in enumerate(segments)
    ]
    with ArtifactWriter(f"file://{out}/artifacts/rollout-{step:05d}") as writer:
        writer.write_table("segments", segments_to_table(segments))
        writer.write_table("samples", samples_to_table(samples))
        data = _train_data(segments, owners, bool(knobs.get("bad_train_data")))
        writer.write_table("train_data", train_data_to_table(data))
    metrics: dict[str, float] = {"train/mopd_reverse_kl": 1.0 / (step + 1)}
    for k, teacher in enumerate(teachers):
        kl = (1.0 + k) * math.exp(-0.3 * step)
        metrics[f"rollout/mopd/opd_reverse_kl_train_aggregation_mean/{teacher}"] = kl
        metrics[f"rollout/mopd/raw_reward_trainable_trajectory_mean/{teacher}"] = 1.0 - kl / 2
        metrics[f"rollout/reward/dataset/{teacher}"] = min(1.0, 0.25 * (step + k))  # pass rate
    metrics["rollout/raw_reward"] = 0.5
    metrics["train/pg_loss"] = 0.01 * (step + 1)
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "time": time.time(), "metrics": metrics}) + "\n")
    print(f"step {step + 1}/{run['num_steps']} reverse_kl={metrics['train/mopd_reverse_kl']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-config", required=True)
    run = json.loads(Path(parser.parse_args().run_config).read_text())
    missing = [key for key in REQUIRED if key not in run]
    if missing:
        raise SystemExit(f"contract job: RUN.json lacks {missing}")
    _check_services(run)
    knobs = dict(run["advanced"].get("contract_job") or {})
    config = json.loads(Path(run["mopd_config"]).read_text())
    teachers = sorted(config["teachers"]) if run["objective"] == "mopd" else ["all"]
    out = Path(run["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    for step in range(int(run["num_steps"])):
        if knobs.get("fail_at_step") == step:
            print("Traceback (most recent call last):", flush=True)
            print(f"RuntimeError: contract job fails at step {step} as asked", flush=True)
            return int(knobs.get("fail_exit", 3))
        _step(run, step, teachers, knobs)
        sys.stdout.flush()
        time.sleep(float(knobs.get("step_sleep_s", 0)))
    (out / "checkpoints" / f"step-{run['num_steps']}").mkdir(parents=True, exist_ok=True)
    summary = {"teachers": teachers, "steps": run["num_steps"]}
    (out / "summary.json").write_text(json.dumps(summary))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
