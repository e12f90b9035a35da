"""One embedded MOPD (or GRPO) job against its own engine and recording proxy, for benchmarks
and tests.

    from dressage.testing.mopd_run import routed_config, run_mopd_job, task_config
    config = routed_config(EMBEDDED, "swapped", folder)          # a control
    result = run_mopd_job(config, student, folder, seed=0, steps=100)
    result.before, result.after     # {"calculator": 0.125, ...}: held-out accuracy
    calc = task_config(EMBEDDED, "calculator", folder)           # GRPO on one task
    run_mopd_job(calc, student, folder2, seed=0, steps=40, objective="grpo",
                 advanced={"n_samples_per_prompt": 8})

What ``make demo``'s ``train`` task runs, without Airflow: :func:`start_services` (the embedded
engine serving the student, the proxy in front of it), then ``python -m dressage.jobs.train`` on
a RUN.json with the demo's recipe (dense objective with a forward-KL share of 0.5, 48-token
turns, two agent turns, packed micro-batches, groups at most 2 weight versions stale), then the
services stopped. Accuracy is the job's own held-out measurement (``eval/accuracy/<task>``: the
agent loop, greedy, on the config's ``eval_path`` rows) before the first step and after the last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dressage.config.job import EMBEDDED_MOPD_OPTIONS
from dressage.config.run import TrainRunConfig
from dressage.launch.local import LocalLauncher
from dressage.launch.services import ServicePlan, start_services, stop_services
from dressage.reporting.metrics import read_metrics

__all__ = ["ROUTINGS", "MopdRunResult", "routed_config", "run_mopd_job", "task_config"]

Routing = Literal["configured", "swapped", "one_teacher"]
ROUTINGS: tuple[Routing, ...] = ("configured", "swapped", "one_teacher")
ACCURACY_PREFIX = "eval/accuracy/"


@dataclass(frozen=True)
class MopdRunResult:
    """Held-out accuracy per task before the first step and after the last; the job's folder."""

    before: dict[str, float]
    after: dict[str, float]
    seconds: float
    folder: Path


def routed_config(
    source: Path, routing: Routing, folder: Path, *, teacher: str | None = None
) -> Path:
    """A copy of the MOPD config ``source`` with its datasets' routing changed, paths absolute:
    ``configured`` as is, ``swapped`` (each of two datasets scored by the other's teacher),
    ``one_teacher`` (``teacher``, by default the first dataset's, scores every dataset; the
    other teachers are dropped). Written to ``folder/<routing>[-<teacher>].json``."""
    data = json.loads(source.read_text())
    teachers = [ds["teacher_id"] for ds in data["datasets"]]
    if teacher is not None and routing != "one_teacher":
        raise ValueError(f"routing {routing!r} takes no teacher, got {teacher!r}")
    if teacher is not None and teacher not in data["teachers"]:
        raise ValueError(f"{source}: no teacher {teacher!r} (it has {sorted(data['teachers'])})")
    for ds in data["datasets"]:
        for key in ("path", "eval_path"):
            if ds.get(key):
                ds[key] = str((source.parent / ds[key]).resolve())
    if routing == "swapped":
        if len(set(teachers)) != 2:
            raise ValueError(f"{source}: swapping needs exactly two teachers, got {teachers}")
        first, second = dict.fromkeys(teachers)
        for ds in data["datasets"]:
            ds["teacher_id"] = second if ds["teacher_id"] == first else first
    elif routing == "one_teacher":
        teacher = teacher or teachers[0]
        for ds in data["datasets"]:
            ds["teacher_id"] = teacher
        data["teachers"] = {teacher: data["teachers"][teacher]}
    elif routing != "configured":
        raise ValueError(f"routing {routing!r}: expected one of {ROUTINGS}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"{routing}-{teacher}.json" if teacher else f"{routing}.json")
    path.write_text(json.dumps(data, indent=1))
    return path


def task_config(source: Path, task: str, folder: Path) -> Path:
    """A copy of the MOPD config ``source`` with only the dataset of ``task``, paths absolute
    (what a GRPO run on one task reads its prompts and held-out rows from)."""
    data = json.loads(source.read_text())
    kept = [ds for ds in data["datasets"] if ds.get("task", ds["name"]) == task]
    if not kept:
        raise ValueError(f"{source}: no dataset for task {task!r}")
    for ds in kept:
        for key in ("path", "eval_path"):
            if ds.get(key):
                ds[key] = str((source.parent / ds[key]).resolve())
    data["datasets"] = kept
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{task}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def run_mopd_job(
    config: Path,
    student: Path,
    folder: Path,
    *,
    seed: int,
    steps: int,
    prompts_per_step: int = 32,
    learning_rate: float = 2e-3,
    device: str = "cpu",
    advanced: dict[str, Any] | None = None,
    objective: Literal["mopd", "grpo"] = "mopd",
) -> MopdRunResult:
    """Run one job in ``folder`` (created; must not exist); raise with its log's tail if it
    fails. ``objective="grpo"``: the same job as ``dressage_rl`` runs it (reward only, the
    config's datasets as prompts; set ``n_samples_per_prompt`` in ``advanced``)."""
    folder.mkdir(parents=True)
    launcher = LocalLauncher(folder / "jobs")
    plan = ServicePlan(
        student=student,
        store_dir=folder / "store",
        admin_key_file=folder / "secrets" / "admin_key",
        id_prefix=f"mopd-run-{folder.name}",
    )
    started = time.monotonic()
    services = start_services(launcher, plan)
    try:
        tiny = {
            k: v for k, v in EMBEDDED_MOPD_OPTIONS.items()
            if objective == "mopd" or not k.startswith("mopd_")
        }  # fmt: skip
        recipe = {**tiny, "learning_rate": learning_rate, "eval_interval": steps, "device": device}
        run = TrainRunConfig(
            objective=objective,
            mopd_config=str(config),
            student=str(student),
            engine_url=services.engine_url,
            proxy_url=services.proxy_url,
            output_dir=str(folder / "output"),
            num_steps=steps,
            seed=seed,
            rollout_batch_size=prompts_per_step,
            advanced={**recipe, **(advanced or {})},
        )
        run_json = run.write(folder / "run.json")
        env = {
            **os.environ,
            "DRESSAGE_PROXY_ADMIN_KEY": plan.admin_key_file.read_text().strip(),
            "DRESSAGE_ENGINE_ADMIN_KEY": plan.engine_key_path.read_text().strip(),
        }
        with (folder / "job.log").open("w") as log:
            code = subprocess.run(
                [sys.executable, "-m", "dressage.jobs.train", "--run-config", str(run_json)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
    finally:
        stop_services(launcher, services.submission_ids)
    if code != 0:
        tail = (folder / "job.log").read_text()[-3000:]
        raise RuntimeError(f"the MOPD job in {folder} exited {code}:\n{tail}")
    evals = [
        r["metrics"]
        for r in read_metrics(folder / "output" / "metrics.jsonl")
        if any(k.startswith(ACCURACY_PREFIX) for k in r.get("metrics", {}))
    ]
    if not evals:
        raise RuntimeError(f"the MOPD job in {folder} measured no held-out accuracy")

    def tasks(metrics: dict[str, float]) -> dict[str, float]:
        return {
            k[len(ACCURACY_PREFIX) :]: v
            for k, v in metrics.items()
            if k.startswith(ACCURACY_PREFIX) and k != ACCURACY_PREFIX + "all"
        }

    return MopdRunResult(
        tasks(evals[0]), tasks(evals[-1]), round(time.monotonic() - started, 1), folder
    )
