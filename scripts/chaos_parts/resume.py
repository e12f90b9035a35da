"""Part 7: the embedded MOPD job killed with ``kill -9`` mid-run, run again, and measured.

For each seed the job (:func:`dressage.testing.mopd_run.run_mopd_job`: its own engine and proxy,
``python -m dressage.jobs.train`` on a RUN.json) runs twice: once straight through, and once
killed (SIGKILL to its process group) right after it prints step ``kill_after`` and then run
again on the same folder, as Airflow's retry of ``train`` runs it. Checked per crashed run:

- the second attempt resumed (``resuming from ...``) from the last checkpoint: at most one save
  interval behind the kill (one more only if the kill tore the save in progress, which then
  must not be chosen), so at most ``save_interval`` steps are trained twice;
- ``metrics.jsonl`` holds every training step once, none twice, none missing;

and over the seeds: the crashed runs' held-out accuracy after the last step, per task, falls
within the straight runs' range (widened by one held-out row, the measurement's resolution).
The full run trains ``configs/mopd/embedded.json`` as ``make demo`` does; the quick run (the
test suite's) trains the tiny test models for three steps and reports the accuracy unjudged.
"""

from __future__ import annotations

import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .services import REPO

EMBEDDED = REPO / "configs/mopd/embedded.json"
DATA = REPO / "configs/mopd/data"
TASKS = ("calculator", "lookup")
QUICK_ADVANCED = {"max_response_len": 24, "agent_max_turns": 2, "groups_in_flight": 3}
"""The quick run's shorter turns (the tiny test student's 248k vocabulary is slow to sample)."""


def _quick_config(folder: Path, eval_rows: int = 2) -> tuple[Path, str]:
    """A MOPD config of the tiny test models (no build), held out on ``eval_rows`` rows a task."""
    folder.mkdir(parents=True, exist_ok=True)
    datasets = []
    for task in TASKS:
        rows = (DATA / f"{task}.eval.jsonl").read_text().splitlines(True)[:eval_rows]
        (folder / f"{task}.eval.jsonl").write_text("".join(rows))
        datasets.append(
            {
                "name": task,
                "path": str(DATA / f"{task}.jsonl"),
                "teacher_id": task,
                "weight": 1.0,
                "agent_mode": "blackbox",
                "task": task,
                "eval_path": str(folder / f"{task}.eval.jsonl"),
            }
        )
    config = {
        "student": {"hf_checkpoint": "tiny:seed=0"},
        "teachers": {"calculator": {"load": "tiny:seed=1"}, "lookup": {"load": "tiny:seed=2"}},
        "datasets": datasets,
        "reward_modules": ["dressage.reward.builtin"],
    }
    path = folder / "quick.json"
    path.write_text(json.dumps(config, indent=1))
    return path, "tiny:seed=0"


def _eval_rows(config: Path) -> int:
    """The fewest held-out rows of any task (one row is the accuracy's resolution)."""
    data = json.loads(config.read_text())
    return min(
        len(Path(ds["eval_path"]).read_text().splitlines())
        for ds in data["datasets"]
        if ds.get("eval_path")
    )


def resume_round(
    workdir: Path,
    *,
    seeds: list[int],
    steps: int,
    save_interval: int,
    kill_after: int,
    prompts: int,
    parallel: int,
    quick: bool,
) -> dict[str, Any]:
    """Run the round (the module docstring); its figures."""
    from dressage.config.mopd import load_mopd_config
    from dressage.testing.mopd_run import logged_steps, routed_config, run_mopd_job
    from dressage.tiny.checkpoints import build_checkpoints, resolve_checkpoint

    work = workdir / "resume"
    if quick:
        config, student_spec = _quick_config(work / "configs")
    else:
        built = build_checkpoints(load_mopd_config(EMBEDDED).built_specs())  # cached
        if failed := [str(b) for b in built if isinstance(b, ValueError)]:
            raise RuntimeError(f"building the config's checkpoints failed: {failed}")
        config = routed_config(EMBEDDED, "configured", work / "configs")
        student_spec = json.loads(EMBEDDED.read_text())["student"]["hf_checkpoint"]
    student = resolve_checkpoint(student_spec)
    advanced: dict[str, Any] = {"save_interval": save_interval, "eval_interval": steps}
    if quick:
        advanced |= QUICK_ADVANCED

    def one(job: tuple[int, bool]) -> dict[str, Any]:
        seed, crash = job
        folder = work / f"{'crashed' if crash else 'straight'}-s{seed}"
        result = run_mopd_job(
            config,
            student,
            folder,
            seed=seed,
            steps=steps,
            prompts_per_step=prompts,
            advanced=advanced,
            kill_after_step=kill_after if crash else None,
        )
        row: dict[str, Any] = {
            "seed": seed,
            "run": "crashed" if crash else "straight",
            "before": result.before,
            "after": result.after,
            "seconds": result.seconds,
            **logged_steps(folder / "output" / "metrics.jsonl"),
        }
        if result.crash is not None:
            row |= result.crash.as_dict()
        print(json.dumps({k: v for k, v in row.items() if k != "steps"}), flush=True)
        return row

    jobs = [(seed, crash) for seed in seeds for crash in (False, True)]
    with ThreadPoolExecutor(parallel) as pool:
        runs = list(pool.map(one, jobs))
    return judge(runs, steps, save_interval, kill_after, 1 / _eval_rows(config), quick)


def judge(
    runs: list[dict[str, Any]],
    steps: int,
    save_interval: int,
    kill_after: int,
    resolution: float,
    quick: bool,
) -> dict[str, Any]:
    """The round's figures from its runs (``resolution``: one held-out row's accuracy)."""
    crashed = [r for r in runs if r["run"] == "crashed"]
    straight = [r for r in runs if r["run"] == "straight"]
    accuracy: dict[str, Any] = {}
    for task in sorted({t for r in runs for t in r["after"]}):
        ref = [r["after"][task] for r in straight]
        got = [r["after"][task] for r in crashed]
        low, high = min(ref) - resolution, max(ref) + resolution
        accuracy[task] = {
            "straight": ref,
            "crashed": got,
            "straight_mean": statistics.fmean(ref),
            "crashed_mean": statistics.fmean(got),
            "range": [round(low, 4), round(high, 4)],
            "within": low - 1e-9 <= statistics.fmean(got) <= high + 1e-9,
        }

    def from_last_checkpoint(r: dict[str, Any]) -> bool:
        resumed = r.get("resumed_at")
        return (
            resumed is not None
            and (resumed - 1) % save_interval == 0
            and kill_after - save_interval <= resumed - 1 <= kill_after
        )

    return {
        "runs": [{k: v for k, v in r.items() if k != "steps"} for r in runs],
        "steps": steps,
        "save_interval": save_interval,
        "kill_after": kill_after,
        "crashed_runs": len(crashed),
        "resumed_from_last_checkpoint": sum(from_last_checkpoint(r) for r in crashed),
        "max_steps_lost": max((r["steps_lost"] for r in crashed), default=None),
        "steps_complete": sum(r["steps"] == list(range(steps)) for r in runs),
        "duplicated_steps": sum(len(r["duplicated"]) for r in runs),
        "missing_steps": sum(len(r["missing"]) for r in runs),
        "accuracy": accuracy,
        "accuracy_judged": not quick,
        "runs_total": len(runs),
    }


def held(figures: dict[str, Any]) -> bool:
    """What issue 28 asks of the round (the accuracy only where it was judged)."""
    return (
        figures["crashed_runs"] > 0
        and figures["resumed_from_last_checkpoint"] == figures["crashed_runs"]
        and figures["max_steps_lost"] is not None
        and figures["max_steps_lost"] <= figures["save_interval"]
        and figures["steps_complete"] == figures["runs_total"]
        and figures["duplicated_steps"] == figures["missing_steps"] == 0
        and (
            not figures["accuracy_judged"]
            or all(task["within"] for task in figures["accuracy"].values())
        )
    )
