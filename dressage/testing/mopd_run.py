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

The job runs as the DAG's ``train`` task runs it: a supervised local job of
:class:`~dressage.launch.local.LocalLauncher`. ``kill_after_step=K`` crashes it on purpose: once it
has printed ``step K/N``, its process group gets ``SIGKILL`` (``kill -9``: no handler runs,
nothing is flushed, no exit record), and the same job is submitted again, as Airflow's retry of
``train`` submits it: a new attempt on the same folder. The result's ``crash`` says where the
second attempt resumed (:class:`CrashResume`) and :func:`logged_steps` what ``metrics.jsonl``
holds.

    result = run_mopd_job(config, student, folder, seed=0, steps=100, kill_after_step=55,
                          advanced={"save_interval": 10})
    result.crash.resumed_at, result.crash.steps_lost     # 51, 5: steps 51 to 55 trained twice
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dressage.config.job import EMBEDDED_MOPD_OPTIONS
from dressage.config.run import TrainRunConfig
from dressage.launch.base import JobSpec, JobState, JobStatus
from dressage.launch.local import LocalLauncher
from dressage.launch.services import ServicePlan, start_services, stop_services
from dressage.reporting.metrics import read_metrics

__all__ = [
    "ROUTINGS",
    "CrashResume",
    "MopdRunResult",
    "logged_steps",
    "routed_config",
    "run_job_process",
    "run_mopd_job",
    "task_config",
]

Routing = Literal["configured", "swapped", "one_teacher"]
ROUTINGS: tuple[Routing, ...] = ("configured", "swapped", "one_teacher")
ACCURACY_PREFIX = "eval/accuracy/"
STEP_RECORD_KEY = "perf/step_wall_s"
"""In every record a training step writes to ``metrics.jsonl`` (:class:`RunOutputs`), in no
eval pass's record."""
_STEP_LINE = re.compile(r"step (\d+)/(\d+) ")
_RESUMED_LINE = re.compile(r"resuming from (\S+): step (\d+)/(\d+)$")


@dataclass(frozen=True)
class CrashResume:
    """A job killed once and run again on its folder: the steps are 1-based, as the job prints
    them."""

    killed_after: int
    """Steps the first attempt had finished (printed) when it was killed."""
    resumed_at: int | None
    """The step the second attempt started at (its ``resuming from ...`` line); None: it
    started afresh (no checkpoint was complete)."""
    checkpoint: str | None
    """The checkpoint folder it resumed from."""
    kill_s: float
    """Seconds from the job's start to its kill."""

    @property
    def steps_lost(self) -> int:
        """Steps the first attempt finished that the second trained again."""
        return self.killed_after - ((self.resumed_at or 1) - 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "killed_after": self.killed_after,
            "resumed_at": self.resumed_at,
            "checkpoint": self.checkpoint,
            "steps_lost": self.steps_lost,
            "kill_s": self.kill_s,
        }


@dataclass(frozen=True)
class MopdRunResult:
    """Held-out accuracy per task before the first step and after the last; the job's folder;
    with ``kill_after_step``, where the second attempt resumed."""

    before: dict[str, float]
    after: dict[str, float]
    seconds: float
    folder: Path
    crash: CrashResume | None = None


def logged_steps(metrics: Path) -> dict[str, list[int]]:
    """The training steps ``metrics.jsonl`` holds a record of (0-based), and those it holds
    twice or lacks between 0 and the last."""
    from dressage.reporting.metrics import read_metrics

    counts = Counter(
        int(r["step"]) for r in read_metrics(metrics) if STEP_RECORD_KEY in r.get("metrics", {})
    )
    last = max(counts, default=-1)
    return {
        "steps": sorted(counts),
        "duplicated": sorted(step for step, n in counts.items() if n > 1),
        "missing": [step for step in range(last + 1) if step not in counts],
    }


def run_job_process(
    launcher: LocalLauncher,
    spec: JobSpec,
    *,
    kill_after_step: int | None = None,
    timeout_s: float = 3600.0,
) -> tuple[JobStatus, float | None]:
    """Submit ``spec`` as the training DAG's ``train`` task does (a supervised local job), wait
    for its end; its final status, and, with ``kill_after_step``, the seconds to the kill.

    Once the job prints ``step K/``, its whole process group, the supervisor with it, gets
    SIGKILL: no exit record is written, as when the machine dies, and the launcher reports the
    job failed, so a second :meth:`LocalLauncher.submit` of the same id (a retry of ``train``)
    starts a new attempt. A job that ends before step K is not killed (kill time None)."""
    started = time.monotonic()
    launcher.submit(spec)
    folder = launcher.job_dir(spec.submission_id)
    pid = int(json.loads((folder / "state.json").read_text())["pid"])
    killed: float | None = None
    while True:
        status = launcher.status(spec.submission_id)
        if status is not None and status.state.terminal:
            return status, killed
        if time.monotonic() - started > timeout_s:
            launcher.stop(spec.submission_id)
            raise TimeoutError(f"job {spec.submission_id} ran past {timeout_s} s")
        if kill_after_step is not None and killed is None:
            printed = (folder / "job.log").read_text(errors="replace")
            if any(
                (m := _STEP_LINE.match(line)) and int(m.group(1)) >= kill_after_step
                for line in printed.splitlines()
            ):
                os.killpg(pid, signal.SIGKILL)
                killed = round(time.monotonic() - started, 2)
        time.sleep(0.1)


def _resumed(log: Path) -> tuple[int | None, str | None]:
    """The job log's ``resuming from FOLDER: step S/N`` line: (S, FOLDER)."""
    for line in log.read_text(errors="replace").splitlines():
        if m := _RESUMED_LINE.match(line.strip()):
            return int(m.group(2)), m.group(1)
    return None, None


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
    kill_after_step: int | None = None,
) -> MopdRunResult:
    """Run one job in ``folder`` (created; must not exist); raise with its log's tail if it
    fails. ``objective="grpo"``: the same job as ``dressage_rl`` runs it (reward only, the
    config's datasets as prompts; set ``n_samples_per_prompt`` in ``advanced``).
    ``kill_after_step``: kill -9 the job once it has printed that step, then run it again on the
    same folder (the module docstring); it must be below ``steps``."""
    if kill_after_step is not None and not 0 < kill_after_step < steps:
        raise ValueError(f"kill_after_step must be in [1, {steps - 1}], got {kill_after_step}")
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
        env = {  # on top of this process's environment
            "DRESSAGE_PROXY_ADMIN_KEY": plan.admin_key_file.read_text().strip(),
            "DRESSAGE_ENGINE_ADMIN_KEY": plan.engine_key_path.read_text().strip(),
        }
        spec = JobSpec(
            [sys.executable, "-m", "dressage.jobs.train", "--run-config", str(run_json)],
            submission_id=f"mopd-run-{folder.name}-train",
            env=env,
        )
        log = launcher.job_dir(spec.submission_id) / "job.log"
        crash = None
        status, kill_s = run_job_process(launcher, spec, kill_after_step=kill_after_step)
        if kill_after_step is not None:
            if kill_s is None:
                raise RuntimeError(
                    f"the MOPD job in {folder} ended ({status.state}) before step "
                    f"{kill_after_step}:\n" + log.read_text()[-3000:]
                )
            status, _ = run_job_process(launcher, spec)  # the retry: a new attempt
            resumed_at, checkpoint = _resumed(log)
            crash = CrashResume(kill_after_step, resumed_at, checkpoint, kill_s)
    finally:
        stop_services(launcher, services.submission_ids)
    code = status.exit_code if status.state is not JobState.SUCCEEDED else 0
    if status.state is not JobState.SUCCEEDED:
        shutil.copy(log, folder / "job.log")
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"the MOPD job in {folder} ended {status.state} ({code}):\n{tail}")
    shutil.copy(log, folder / "job.log")
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
        tasks(evals[0]), tasks(evals[-1]), round(time.monotonic() - started, 1), folder, crash
    )
