"""MOPD transfer against controls: a skill moves from the teacher that has it, and only from it.

    python bench/mopd_transfer.py                        # 3 seeds, 100 steps: long on a CPU
    python bench/mopd_transfer.py --device cuda --parallel 9
    python bench/mopd_transfer.py --steps 10 --seeds 0   # a smoke run

The embedded MOPD job itself (``python -m dressage.jobs.train`` against its own engine and
recording proxy, the tool agent, the dense objective: what ``make demo`` runs), on
``configs/mopd/embedded.json``'s student, teachers and data, once per condition and seed:

- (a) ``configured``: each task scored by its own teacher;
- (b) ``swapped``: each task scored by the other task's teacher;
- (c) ``one_teacher``: the calculator teacher scores both tasks;
- (d) ``no_training``: the student as it starts (every run's accuracy before its first step).

Accuracy is the job's own held-out measurement (``eval/accuracy/<task>``: the agent loop,
greedy, on the config's ``eval_path`` rows). Per task and condition: the mean and spread over
seeds. Verdict: on each task (a)'s mean minus its spread is above every control's mean plus its
spread. The last line is that verdict as JSON: ``ours`` is (a)'s accuracy and ``baseline`` the
best control's on the task where (a) leads least, ``ratio`` their quotient (baseline 0: ours/0.01).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dressage.config.mopd import load_mopd_config  # noqa: E402
from dressage.config.run import TrainRunConfig  # noqa: E402
from dressage.launch.local import LocalLauncher  # noqa: E402
from dressage.launch.services import ServicePlan, start_services, stop_services  # noqa: E402
from dressage.reporting.metrics import read_metrics  # noqa: E402
from dressage.tiny.checkpoints import build_checkpoints, resolve_checkpoint  # noqa: E402

EMBEDDED = ROOT / "configs/mopd/embedded.json"
TASKS = ("calculator", "lookup")
CONDITIONS = ("configured", "swapped", "one_teacher")


def variant(config: dict[str, Any], condition: str, folder: Path) -> Path:
    """The embedded config with the datasets' routing changed (paths made absolute)."""
    data = json.loads(json.dumps(config))
    for ds in data["datasets"]:
        ds["path"] = str(EMBEDDED.parent / ds["path"])
        ds["eval_path"] = str(EMBEDDED.parent / ds["eval_path"])
        if condition == "swapped":
            ds["teacher_id"] = "lookup" if ds["teacher_id"] == "calculator" else "calculator"
        elif condition == "one_teacher":
            ds["teacher_id"] = "calculator"
    if condition == "one_teacher":
        data["teachers"] = {"calculator": data["teachers"]["calculator"]}
    path = folder / f"{condition}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def run_one(
    condition: str, seed: int, config: Path, student: Path, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """One job against its own engine and proxy; returns its first and last accuracies."""
    folder = work / f"{condition}-s{seed}"
    folder.mkdir(parents=True)
    launcher = LocalLauncher(folder / "jobs")
    plan = ServicePlan(
        student=student,
        store_dir=folder / "store",
        admin_key_file=folder / "secrets" / "admin_key",
        id_prefix=f"bench-{condition}-{seed}",
    )
    started = time.monotonic()
    services = start_services(launcher, plan)
    try:
        run = TrainRunConfig(
            objective="mopd",
            mopd_config=str(config),
            student=str(student),
            engine_url=services.engine_url,
            proxy_url=services.proxy_url,
            output_dir=str(folder / "output"),
            num_steps=args.steps,
            seed=seed,
            rollout_batch_size=args.batch,
            advanced={
                "learning_rate": args.lr,
                "max_response_len": 48,
                "agent_max_turns": 2,
                "eval_interval": args.steps,
                "mopd_objective": "dense",
                "device": args.device,
            },
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
        tail = (folder / "job.log").read_text()[-2000:]
        raise RuntimeError(f"{condition} seed {seed}: the job exited {code}:\n{tail}")
    evals = [
        r["metrics"]
        for r in read_metrics(folder / "output" / "metrics.jsonl")
        if any(k.startswith("eval/accuracy/") for k in r.get("metrics", {}))
    ]
    first, last = evals[0], evals[-1]
    result = {
        "condition": condition,
        "seed": seed,
        "before": {t: first[f"eval/accuracy/{t}"] for t in TASKS},
        "after": {t: last[f"eval/accuracy/{t}"] for t in TASKS},
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def summarise(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32, help="prompts per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--out", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    config = json.loads(EMBEDDED.read_text())
    build_checkpoints(load_mopd_config(EMBEDDED).built_specs())  # once; cached
    student = resolve_checkpoint(config["student"]["hf_checkpoint"])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mopd-transfer-") as tmp:
        work = Path(tmp)
        configs = {c: variant(config, c, work) for c in CONDITIONS}
        jobs = [(c, s) for s in args.seeds for c in CONDITIONS]
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(
                pool.map(lambda job: run_one(*job, configs[job[0]], student, args, work), jobs)
            )
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for condition in CONDITIONS:
        runs = [r for r in results if r["condition"] == condition]
        table[condition] = {t: summarise([r["after"][t] for r in runs]) for t in TASKS}
    table["no_training"] = {t: summarise([r["before"][t] for r in results]) for t in TASKS}
    print(f"{'condition':<12} " + " ".join(f"{t:>18}" for t in TASKS))
    for condition, row in table.items():
        cells = " ".join(f"{m:>10.0%} ± {s:<5.0%}" for m, s in (row[t] for t in TASKS))
        print(f"{condition:<12} {cells}")
    leads = {}
    for t in TASKS:
        mean, spread = table["configured"][t]
        best = max((table[c][t] for c in table if c != "configured"), key=lambda v: v[0] + v[1])
        leads[t] = (mean - spread - (best[0] + best[1]), mean, best[0])
    task = min(leads, key=lambda t: leads[t][0])
    margin, ours, baseline = leads[task]
    verdict = {
        "metric": "heldout_accuracy_configured_vs_best_control",
        "unit": "fraction solved (agent loop, greedy)",
        "task": task,
        "baseline": round(baseline, 4),
        "ours": round(ours, 4),
        "ratio": round(ours / max(baseline, 0.01), 3),
        "target": "configured routing above every control on each task, beyond the spreads",
        "met": all(v[0] > 0 for v in leads.values()),
        "table": {c: {t: [round(x, 4) for x in row[t]] for t in TASKS} for c, row in table.items()},
        "seeds": args.seeds,
        "steps": args.steps,
        "prompts_per_step": args.batch,
        "device": args.device,
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.out:
        args.out.write_text(json.dumps({"runs": results, "verdict": verdict}, indent=1))
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
