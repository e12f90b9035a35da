"""What a training job leaves in its ``output_dir``, written step by step.

    outputs = RunOutputs(Path(run.output_dir), num_steps=3, proxy=admin_client)
    outputs.step(batch, train_metrics, pause_event)     # after each optimizer step
    outputs.finish(summary_extra)                       # summary.json

Per step: ``artifacts/rollout-XXXXX/`` (one dressage artifact, manifest last: the tables
``steps`` and ``segments`` of the step's trajectories as the proxy recorded them, ``samples``
and ``train_data``), one ``metrics.jsonl`` record ``{"step", "time", "metrics"}`` (the rollout's,
the trainer's and the weight update's that preceded the step, ``pause/*``), and a progress line
on stdout. An eval pass (:meth:`RunOutputs.evaluation`) adds a record of the step it followed
(``-1``: before training). ``summary.json`` at the end.

A job resumed from a checkpoint passes ``resume_step`` (the checkpoint's metrics step): records
of later steps are dropped from ``metrics.jsonl`` (the job writes those steps again) and the
artifacts of those steps are replaced as they are written. A fresh start drops an earlier
attempt's records altogether.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dressage.proxy.client import ProxyClientError, SyncProxyClient
from dressage.reporting.metrics import read_metrics
from dressage.schemas import (
    samples_to_table,
    segments_to_table,
    steps_to_table,
    train_data_to_table,
)
from dressage.slime.sample_meta import PARENT_TRAJ_ID
from dressage.staging import ArtifactWriter
from dressage.training.embedded.async_backend import RolloutBatch
from dressage.training.embedded.evaluation import ACCURACY_PREFIX
from dressage.training.metrics_sink import MetricsSink
from dressage.trajectory import Segment, StepRecord

__all__ = ["RunOutputs", "pause_metrics"]

_PROGRESS_KEYS = (
    ("reverse_kl", "train/mopd_reverse_kl"),
    ("heldout_kl", "eval/mopd/reverse_kl/all"),
    ("pg_loss", "train/pg_loss"),
    ("reward", "rollout/reward_mean"),
)


def pause_metrics(event: Mapping[str, Any] | None) -> dict[str, float]:
    """``pause/*`` metrics of one weight update (an entry of ``RolloutPause.events``)."""
    if not event:
        return {}
    out = {
        "pause/paused": float(bool(event.get("paused"))),
        "pause/update_s": float(event.get("update_s", 0.0)),
        "pause/pause_call_s": float(event.get("pause_s", 0.0)),
        "pause/resume_call_s": float(event.get("resume_s", 0.0)),
    }
    report = event.get("pause") or {}
    if report:
        out["pause/latency_s"] = float(report.get("latency_s", 0.0))
        out["pause/paused_calls"] = float(report.get("paused_calls", 0))
    resumed = event.get("resume") or {}
    if resumed:
        out["pause/resume_latency_s"] = float(resumed.get("latency_s", 0.0))
        out["pause/released_calls"] = float(resumed.get("released_calls", 0))
    if event.get("version") is not None:
        out["pause/weight_version"] = float(event["version"])
    return out


class RunOutputs:
    """The job's output folder (see the module docstring)."""

    def __init__(
        self,
        output_dir: Path,
        *,
        num_steps: int,
        proxy: SyncProxyClient | None,
        resume_step: int | None = None,
    ) -> None:
        self.dir = output_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.num_steps = num_steps
        self.proxy = proxy
        log_path = self.dir / "metrics.jsonl"
        if resume_step is None:
            log_path.unlink(missing_ok=True)
        self.sink = MetricsSink(log_path, keep_through=resume_step)
        self.started = time.monotonic()
        self.last: dict[str, Any] = {}

    def _trajectories(self, samples: Sequence[Any]) -> tuple[list[StepRecord], list[Segment]]:
        """The recorded steps and segments of the step's sessions (failed attempts and
        discarded sessions have none)."""
        steps: list[StepRecord] = []
        segments: list[Segment] = []
        if self.proxy is None:
            return steps, segments
        sessions = sorted({str(s.metadata.get(PARENT_TRAJ_ID) or s.session_id) for s in samples})
        for session in sessions:
            try:
                trajectory = self.proxy.read_trajectory(session)
            except ProxyClientError as exc:
                if exc.status == 404:
                    continue
                raise
            if trajectory.status == "discarded":
                continue
            steps += trajectory.steps
            segments += trajectory.segments
        return steps, segments

    def step(
        self,
        batch: RolloutBatch,
        train_metrics: Mapping[str, float],
        pause_event: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        step = batch.rollout_id
        steps, segments = self._trajectories(batch.samples)
        url = (self.dir / "artifacts" / f"rollout-{step:05d}").resolve().as_uri()
        with ArtifactWriter(url, if_exists="replace") as writer:
            writer.write_table("steps", steps_to_table(steps))
            writer.write_table("segments", segments_to_table(segments))
            writer.write_table("samples", samples_to_table(batch.samples))
            writer.write_table("train_data", train_data_to_table(batch.train_data))
        metrics: dict[str, Any] = {**batch.metrics, **train_metrics, **pause_metrics(pause_event)}
        metrics["perf/step_wall_s"] = time.monotonic() - self.started
        self.sink.log(step, metrics)
        self.last = metrics
        parts = [f"step {step + 1}/{self.num_steps}"]
        parts += [f"{name}={metrics[key]:.4f}" for name, key in _PROGRESS_KEYS if key in metrics]
        parts.append(f"samples={len(batch.samples)} segments={len(segments)}")
        if "pause/paused_calls" in metrics:
            parts.append(f"paused_calls={int(metrics['pause/paused_calls'])}")
        parts.append(f"t={time.monotonic() - self.started:.1f}s")
        print(" ".join(parts), flush=True)
        return metrics

    def evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        """An eval pass after ``step`` (``-1``: before training): one more record of that step
        and a progress line (held-out accuracy per task)."""
        self.sink.log(step, dict(metrics))
        shown = " ".join(
            f"{key[len(ACCURACY_PREFIX) :]}={value:.0%}"
            for key, value in sorted(metrics.items())
            if key.startswith(ACCURACY_PREFIX)
        )
        when = "before training" if step < 0 else f"after step {step + 1}/{self.num_steps}"
        print(f"held-out accuracy {when}: {shown}", flush=True)

    def evaluation_before_training(self) -> dict[str, float]:
        """The metrics logged at step ``-1`` (a resumed job measures them only once)."""
        out: dict[str, float] = {}
        for record in read_metrics(self.sink.path):
            if record["step"] == -1:
                out |= {k: v for k, v in record["metrics"].items() if v is not None}
        return out

    def finish(self, summary: Mapping[str, Any]) -> Path:
        self.sink.close()
        out = {
            **summary,
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "final_metrics": {k: v for k, v in self.last.items() if isinstance(v, int | float)},
        }
        path = self.dir / "summary.json"
        path.write_text(json.dumps(out, indent=2, sort_keys=True, default=str) + "\n")
        return path
