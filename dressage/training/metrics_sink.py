"""Training metrics: always a local JSONL log beside the run's artifacts, W&B when enabled.

One JSON object per line, ``{"step": int, "time": unix seconds, "metrics": {name: number}}``,
flushed per step so a crashed run keeps every step it finished
(``dressage.reporting.metrics.read_metrics`` reads it back). W&B is imported only when
enabled, and its key is read from the environment (``WANDB_API_KEY``) by wandb itself::

    with MetricsSink(run_dir / "metrics" / "train.jsonl", wandb=WandbSettings("proj")) as sink:
        sink.log(step, {"loss": 0.31, "teacher/calculator/n_samples": 12})

A run resumed from a checkpoint opens the log with ``keep_through=`` the checkpoint's metrics
step: the records of later steps (written after the save, before the crash) are dropped first,
since the resumed run writes those steps again, so no step appears twice and none is missing.

Inside slime, the rollout log hook (``--custom-rollout-log-function-path
dressage.training.metrics_sink.log_rollout_metrics``) adds the rollout side (rewards, lengths,
per-teacher counts) to ``<--mopd-metrics-dir>``; slime keeps its own W&B logging (the hook
returns False).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from dressage.slime.mopd_args import mopd_args

__all__ = ["MetricsSink", "WandbSettings", "log_rollout_metrics", "rollout_metrics"]


@dataclass(frozen=True)
class WandbSettings:
    project: str
    group: str | None = None
    run_name: str | None = None


def _number(value: Any) -> float | int | None:
    # JSON has no NaN/inf; a null keeps the line valid and the step visible.
    if isinstance(value, bool):
        return int(value)
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        value = value.item()
    if isinstance(value, int):
        return value
    number = float(value)
    return number if math.isfinite(number) else None


class MetricsSink:
    """Append-only JSONL metrics log, mirrored to W&B when ``wandb`` settings are given."""

    def __init__(
        self,
        path: str | Path,
        *,
        wandb: WandbSettings | None = None,
        config: Mapping[str, Any] | None = None,
        keep_through: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if keep_through is not None:
            _drop_records_after(self.path, keep_through)
        self._file = self.path.open("a", encoding="utf-8")
        self._wandb_run: Any = None
        if wandb is not None:
            try:
                import wandb as wandb_lib
            except ImportError as exc:
                self._file.close()
                raise RuntimeError("W&B logging is enabled but wandb is not installed") from exc
            self._wandb_run = wandb_lib.init(
                project=wandb.project,
                group=wandb.group,
                name=wandb.run_name,
                dir=str(self.path.parent),
                config=dict(config or {}),
            )

    def log(self, step: int, metrics: Mapping[str, Any], *, at: float | None = None) -> None:
        values = {str(k): _number(v) for k, v in metrics.items()}
        record = {"step": int(step), "time": time.time() if at is None else at, "metrics": values}
        self._file.write(json.dumps(record, allow_nan=False, sort_keys=True) + "\n")
        self._file.flush()
        if self._wandb_run is not None and step >= 0:  # W&B steps start at 0 (-1: before)
            self._wandb_run.log({k: v for k, v in values.items() if v is not None}, step=step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _drop_records_after(path: Path, step: int) -> None:
    """Rewrite ``path`` (atomically) without the records of steps after ``step`` and without a
    torn last line."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and int(record.get("step", 0)) <= step:
            kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _teacher_of(sample: Any) -> str | None:
    metadata = getattr(sample, "metadata", None) or {}
    teacher = metadata.get("teacher_id") if isinstance(metadata, Mapping) else None
    return str(teacher) if teacher is not None else None


def rollout_metrics(samples: Sequence[Any], rollout_time: float) -> dict[str, float | int]:
    """Reward, length and per-teacher counts of one rollout's (flat) samples."""
    rewards = [s.reward for s in samples if isinstance(s.reward, int | float)]
    lengths = [int(s.response_length) for s in samples]
    status = [getattr(getattr(s, "status", None), "value", "") for s in samples]
    out: dict[str, float | int] = {
        "rollout/n_samples": len(samples),
        "rollout/time_s": float(rollout_time),
        "rollout/truncated_frac": status.count("truncated") / max(len(samples), 1),
    }
    if rewards:
        out["rollout/reward_mean"] = sum(rewards) / len(rewards)
    if lengths:
        out["rollout/response_length_mean"] = sum(lengths) / len(lengths)
    for teacher, count in sorted(Counter(t for t in map(_teacher_of, samples) if t).items()):
        out[f"rollout/teacher/{teacher}/n_samples"] = count
    return out


def log_rollout_metrics(
    rollout_id: int,
    args: Any,
    samples: Sequence[Any],
    rollout_extra_metrics: Mapping[str, Any] | None,
    rollout_time: float,
) -> bool:
    """slime's ``--custom-rollout-log-function-path`` hook (docs/slime.md §2).

    Appends to ``<args.mopd_metrics_dir>/rollout.jsonl`` and returns False so slime's default
    rollout logging (W&B, console) still runs.
    """
    metrics_dir = mopd_args(args).mopd_metrics_dir
    if not metrics_dir:
        return False
    flat = _flatten(samples)
    metrics: dict[str, Any] = dict(rollout_metrics(flat, rollout_time))
    for key, value in (rollout_extra_metrics or {}).items():
        if isinstance(value, int | float):
            metrics[f"rollout/extra/{key}"] = value
    with MetricsSink(Path(metrics_dir) / "rollout.jsonl") as sink:
        sink.log(rollout_id, metrics)
    return False


def _flatten(items: Any) -> list[Any]:
    if isinstance(items, list | tuple):
        return [leaf for item in items for leaf in _flatten(item)]
    return [items]
