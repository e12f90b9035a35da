"""The training job: RUN.json in, a trained student and its artifacts out.

    DRESSAGE_PROXY_ADMIN_KEY=... DRESSAGE_ENGINE_ADMIN_KEY=... \
        python -m dressage.jobs.train --run-config RUN.json

RUN.json is a :class:`~dressage.config.run.TrainRunConfig` (written by the training DAGs'
``prepare_job``); its ``advanced`` options are :class:`~dressage.config.job.JobOptions`. On the
embedded backend the engine and the proxy already run (``engine_url``, ``proxy_url``; the DAG's
setup task started them) and the job runs, in this process, slime's async loop
(:func:`dressage.training.train_async_with_rollout_pause.train_async`) over the embedded
backend: the PyTorch trainer (with the MOPD teachers), the rollout manager on its own thread
(partial-async rollout with black-box agents through the proxy, or one synchronous batch per
step), and a weight update through ``/update_weights_from_disk`` after every step (with the
engine's control key, ``DRESSAGE_ENGINE_ADMIN_KEY``), with the proxy paused around it
(``DRESSAGE_PROXY_PAUSE_*``). On the ray backend (a Ray job on the
cluster) it starts the proxy on this node and runs slime's command line
(:mod:`dressage.jobs.cluster`). What it writes is described in
:mod:`dressage.jobs.outputs`; checkpoints go to ``output_dir/checkpoints/`` every
``advanced.save_interval`` steps and after the last, and rerunning the job on the same
``output_dir`` resumes from the newest (embedded: :mod:`dressage.training.embedded.checkpoint`;
a checkpoint of another student or other teachers is refused, exit 2).

Exit status: 0 done; 2 a run config that cannot run (the message says why); 1 a failure during
the run (with its traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from dressage.commands import DefaultsHelpFormatter, command_parser
from dressage.config.env import env_secret, env_str
from dressage.config.job import DEFAULT_MOPD_TOPK, JobOptions, advanced_problems
from dressage.config.mopd import (
    MopdConfigError,
    load_mopd_config,
)
from dressage.config.run import TrainRunConfig
from dressage.jobs.job_args import job_args
from dressage.jobs.outputs import RunOutputs
from dressage.reporting.metrics import HELDOUT_KL_PREFIX as HELDOUT_KL
from dressage.slime.periodic import periodic_action
from dressage.tiny.checkpoints import CheckpointNotBuiltError, resolve_checkpoint

__all__ = ["JobConfigError", "main", "run_job"]

log = logging.getLogger("dressage.jobs.train")


class RawDescriptionDefaultsHelpFormatter(
    argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter
):
    """The module docstring as written, each option's default after its help."""


class JobConfigError(ValueError):
    """RUN.json (or what it points at) cannot run; the message names the field."""


def _load(path: Path) -> tuple[TrainRunConfig, JobOptions]:
    try:
        run = TrainRunConfig.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise JobConfigError(f"run config {path}: {exc}") from None
    if run.backend == "embedded" and (not run.engine_url or not run.proxy_url):
        raise JobConfigError(
            f"run config {path}: the embedded backend needs engine_url and proxy_url"
        )
    problems = advanced_problems(run)
    if problems:
        raise JobConfigError(f"run config {path}: " + "; ".join(problems))
    return run, JobOptions.model_validate(run.advanced)


def _check_service(name: str, url: str) -> None:
    try:
        status = httpx.get(f"{url.rstrip('/')}/health", timeout=30).status_code
    except httpx.HTTPError as exc:
        raise JobConfigError(f"{name} at {url} is unreachable: {exc}") from None
    if status != 200:
        raise JobConfigError(f"{name} at {url} answers /health with HTTP {status}")


def run_cluster_job(run: TrainRunConfig, options: JobOptions) -> int:
    """The ray backend: slime's command with the proxy beside it (:mod:`dressage.jobs.cluster`)."""
    from dressage.jobs.cluster import (
        cluster_plan,
        grpo_loss_flags,
        node_address,
        optimizer_flags,
        rollout_flags,
        run_on_cluster,
    )

    try:
        plan = cluster_plan(
            run.model_copy(update={"student": str(resolve_checkpoint(run.student))}),
            cluster=options.cluster,
            max_response_len=options.max_response_len,
            temperature=options.temperature,
            n_samples_per_prompt=options.n_samples_per_prompt,
            partial_rollout=options.partial_rollout,
            num_steps_per_rollout=options.num_steps_per_rollout,
            mopd_advantage_clip=options.mopd_advantage_clip,
            mopd_objective=options.mopd_objective,
            mopd_topk=options.mopd_topk,
            mopd_forward_kl_weight=options.mopd_forward_kl_weight,
            host=node_address(),
            environ=os.environ,
            optimizer=[*optimizer_flags(options), *grpo_loss_flags(options)],
            rollout=rollout_flags(options),
            save_interval=options.save_interval,
            continue_from=options.continue_from,
        )
        return run_on_cluster(plan)
    except (MopdConfigError, ValueError) as exc:
        raise JobConfigError(str(exc)) from None


def _check_topk_vocabulary(student: Path, k: int | None) -> None:
    """Refuse a K beyond the student's vocabulary (the teachers share it) before training."""
    from dressage.training.checkpoints import (
        CheckpointError,
        inspect_checkpoint,
        mopd_topk_problems,
    )

    try:
        info = inspect_checkpoint(student)
    except CheckpointError as exc:
        raise JobConfigError(f"student {student}: {exc}") from None
    problems = mopd_topk_problems(info, DEFAULT_MOPD_TOPK if k is None else k)
    if problems:
        raise JobConfigError("; ".join(f"advanced.mopd_topk: {p.message}" for p in problems))


def run_job(run_config: Path) -> dict[str, Any]:
    """Run RUN.json to the end; returns the summary (see the module docstring)."""
    from dressage.proxy.client import SyncProxyClient
    from dressage.rollout.data_source import MopdDataSource
    from dressage.training.checkpoints import CheckpointError
    from dressage.training.embedded import EmbeddedTrainer
    from dressage.training.embedded.async_backend import EmbeddedAsyncBackend, RolloutBatch
    from dressage.training.embedded.checkpoint import continue_from_checkpoint, load_checkpoint
    from dressage.training.embedded.evaluation import HeldOutAccuracy, teacher_accuracy
    from dressage.training.embedded.rollout import EmbeddedRolloutManager
    from dressage.training.proxy_pause_client import RolloutPause, update_weights_with_pause
    from dressage.training.train_async_with_rollout_pause import train_async

    run, options = _load(run_config)
    admin_key = env_str("DRESSAGE_PROXY_ADMIN_KEY")
    if not admin_key:
        raise JobConfigError("DRESSAGE_PROXY_ADMIN_KEY is not set (the proxy's admin key)")
    try:
        engine_key = env_secret("DRESSAGE_ENGINE_ADMIN_KEY")
    except ValueError as exc:
        raise JobConfigError(str(exc)) from None
    if not engine_key:
        raise JobConfigError(
            "DRESSAGE_ENGINE_ADMIN_KEY is not set (the engine's control key, for weight updates)"
        )
    assert run.engine_url and run.proxy_url  # _load checked
    _check_service("engine", run.engine_url)
    _check_service("proxy", run.proxy_url)
    try:
        config = load_mopd_config(run.mopd_config).materialize(resolve_checkpoint)
        student = resolve_checkpoint(run.student)
    except (MopdConfigError, CheckpointNotBuiltError) as exc:  # never trained here
        raise JobConfigError(str(exc)) from None
    if run.objective == "mopd" and options.mopd_objective == "topk":
        _check_topk_vocabulary(student, options.mopd_topk)
    teachers: dict[str, str] = {}
    if run.objective == "mopd":
        teachers = {tid: t.load for tid, t in config.teachers.items()}
    args = job_args(run, options, student=student, admin_key=admin_key)
    output = Path(run.output_dir)
    print(
        f"{run.objective} on {student}: {run.num_steps} steps x {run.rollout_batch_size} prompts, "
        f"teachers {sorted(teachers) or '-'}, partial rollout {options.partial_rollout}",
        flush=True,
    )

    trainer = EmbeddedTrainer(args, teachers=teachers)
    manager = EmbeddedRolloutManager(args, MopdDataSource(args))
    try:
        resumed = load_checkpoint(args, trainer, manager)
        continued = None
        if resumed is None and options.continue_from:
            continued = continue_from_checkpoint(options.continue_from, trainer, manager)
    except (CheckpointError, ValueError) as exc:  # another model or config, a damaged file
        raise JobConfigError(str(exc)) from None
    start = int(args.start_rollout_id or 0)
    started_from = _started_from(output, resumed=resumed is not None, continued=continued)
    if resumed is not None:
        print(f"resuming from {resumed.folder}: step {start + 1}/{run.num_steps}", flush=True)
    elif continued is not None:
        print(
            f"continuing from {continued.folder} (an earlier run's rollout "
            f"{continued.rollout_id + 1}, {continued.optimizer_steps} optimizer steps; "
            f"{continued.carried_groups} prompt groups carried over)",
            flush=True,
        )
    probe = None
    initial: dict[str, float] = {}
    if run.objective == "mopd":  # the exact reverse KL on held-out rows (datasets' eval_path)
        from dressage.training.embedded.probe import HeldOutProbe

        probe = HeldOutProbe.collect(args, config)
        if probe is not None and resumed is None:  # a resumed run measured it before
            # (a continued run: the student it continues, loaded above)
            initial = probe.measure(trainer.model)
            shown = " ".join(f"{k}={v:.4f}" for k, v in initial.items())
            print(f"held-out reverse KL before training: {shown}", flush=True)
    accuracy = HeldOutAccuracy.from_config(
        config, proxy_url=run.proxy_url, admin_key=admin_key, api_key=None
    )
    pause = RolloutPause.from_env(proxy_url=run.proxy_url, admin_key=admin_key)
    with SyncProxyClient(run.proxy_url, admin_key=admin_key) as proxy:
        outputs = RunOutputs(
            output,
            num_steps=run.num_steps,
            proxy=proxy,
            resume_step=resumed.metrics_step if resumed is not None else None,
        )
        probe_due = periodic_action()

        def on_trained(batch: RolloutBatch, metrics: dict[str, float]) -> None:
            # the held-out KL where the accuracy is measured (--eval-interval) and after the
            # last step: every step, it cost a third of a step on the embedded default
            if probe is not None and probe_due(
                batch.rollout_id, options.eval_interval or run.num_steps, None, run.num_steps
            ):
                held_out = probe.measure(trainer.model)
                metrics = metrics | {f"{HELDOUT_KL}{k}": v for k, v in held_out.items()}
            outputs.step(batch, metrics, pause.events[-1] if pause.events else None)

        backend = EmbeddedAsyncBackend(
            trainer=trainer,
            rollout_manager=manager,
            engine_url=run.engine_url,
            weights_dir=output / "weights",
            on_trained=on_trained,
            engine_admin_key=engine_key,
            evaluator=accuracy.measure if accuracy is not None else None,
            on_evaluated=outputs.evaluation,
        )
        initial_accuracy: dict[str, float] = {}
        if resumed is not None:  # measured before the first attempt's training: read back
            before = outputs.evaluation_before_training()
            initial = {
                k[len(HELDOUT_KL) :]: v for k, v in before.items() if k.startswith(HELDOUT_KL)
            }
            initial_accuracy = {k: v for k, v in before.items() if not k.startswith(HELDOUT_KL)}
        elif accuracy is not None:  # the initial student, before any update
            if continued is not None:  # the engine serves the config's student: the one here
                update_weights_with_pause(pause, backend.update_weights, reason="continued")
            initial_accuracy = accuracy.measure()
            # with the held-out KL before training, so its curve starts where accuracy's does
            kl_before = {f"{HELDOUT_KL}{k}": v for k, v in initial.items()}
            outputs.evaluation(-1, initial_accuracy | kl_before)
        try:
            if start < run.num_steps:
                train_async(args, backend, pause)
                if accuracy is not None and not _evaluated_last(args, run.num_steps):
                    outputs.evaluation(run.num_steps - 1, accuracy.measure())
            else:  # the checkpoint is the last step's: nothing is left to run
                print(f"all {run.num_steps} steps were trained before", flush=True)
        finally:
            pause.close()
        summary = {
            "objective": run.objective,
            "steps": run.num_steps,
            "resumed_from": resumed.rollout_id if resumed is not None else None,
            "started_from": started_from,
            "student": str(student),
            "teachers": sorted(teachers),
            "partial_rollout": options.partial_rollout,
            "weight_version": backend.version,
            "weight_updates": len(pause.events),
            "heldout_reverse_kl_initial": initial,
            "heldout_accuracy_initial": initial_accuracy,
            "teacher_accuracy": teacher_accuracy(config) if run.objective == "mopd" else {},
            "paused_calls": sum(
                (e.get("pause") or {}).get("paused_calls", 0) for e in pause.events
            ),
        }
        outputs.finish(summary)
    print(f"done: {run.num_steps} steps, weight version {backend.version}", flush=True)
    return summary


STARTED_FROM = "started_from.json"


def _started_from(output: Path, *, resumed: bool, continued: Any) -> dict[str, Any]:
    """What the run started from (``fresh``, or ``continued`` with the checkpoint and the data
    position), written by its first attempt to ``output_dir/started_from.json`` and read back by
    a resumed one, which started from the same."""
    path = output / STARTED_FROM
    if resumed and path.is_file():
        recorded: dict[str, Any] = json.loads(path.read_text())
        return recorded
    started = (
        {"kind": "fresh"} if continued is None else {"kind": "continued", **continued.as_dict()}
    )
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(started, indent=1) + "\n")
    return started


def _evaluated_last(args: Any, num_steps: int) -> bool:
    """Whether the driver's eval pass ran after the last step (``--eval-interval``)."""
    interval = getattr(args, "eval_interval", None)
    return num_steps > 0 and bool(periodic_action()(num_steps - 1, interval, None, None))


def _quiet_progress_bars() -> None:
    """The job's log is read by people and the DAG's progress: no per-load tqdm bars."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # the ray backend's launcher process needs no transformers
        return
    hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(
        "python -m dressage.jobs.train",
        description=__doc__,
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    parser.add_argument("--run-config", required=True, type=Path, help="RUN.json")
    parser.add_argument("--log-level", default="WARNING", help="of the job's own log lines")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    _quiet_progress_bars()
    try:
        run, options = _load(ns.run_config)
        if run.backend == "ray":
            return run_cluster_job(run, options)
        run_job(ns.run_config)
    except JobConfigError as exc:
        print(f"dressage.jobs.train: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
