"""The training job's contract: its run config (RUN.json), its command and what it writes.

    python -m dressage.jobs.train --run-config RUN.json

RUN.json is a :class:`TrainRunConfig`. The job reads the proxy's admin key from
``DRESSAGE_PROXY_ADMIN_KEY`` and writes into ``output_dir``:

* ``artifacts/rollout-XXXXX/``: one dressage artifact per training step (tables ``segments``,
  ``samples``, ``train_data`` [and ``steps``], manifest last);
* ``metrics.jsonl``: ``{"step", "time", "metrics": {...}}`` per step, with keys such as
  ``train/mopd_reverse_kl``, ``rollout/mopd/opd_reverse_kl_train_aggregation_mean/<teacher>``
  and ``rollout/mopd/raw_reward_trainable_trajectory_mean/<teacher>``;
* ``summary.json`` and ``checkpoints/``;

prints progress lines on stdout and exits 0 on success. The module is ``dressage.jobs.train``;
``DRESSAGE_JOB_MODULE`` names another one (an internal setting: the orchestration tests run a
small contract job through it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dressage.config.env import declare, env_str

__all__ = ["JOB_MODULE_ENV", "TrainRunConfig", "job_module", "train_entrypoint"]

JOB_MODULE_ENV = "DRESSAGE_JOB_MODULE"
declare(
    JOB_MODULE_ENV,
    "dressage.jobs.train",
    "Module the training DAGs run as `python -m MODULE --run-config RUN.json` "
    "(internal: tests point it at a small contract job).",
)


class TrainRunConfig(BaseModel):
    """RUN.json: what one training job does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Literal["mopd", "grpo"]
    mopd_config: str
    """The MOPD JSON: teachers (MOPD) and the datasets and reward modules (both objectives)."""
    student: str
    """Student checkpoint: an HF folder or a ``tiny:seed=N`` spec."""
    engine_url: str | None
    proxy_url: str | None
    """None on the ray backend: the job starts its own engines and proxy on the cluster."""
    output_dir: str
    num_steps: int = Field(ge=1)
    seed: int
    rollout_batch_size: int = Field(ge=1)
    backend: Literal["embedded", "ray"] = "embedded"
    """Written only when "ray": the job then trains on the cluster it runs in."""
    advanced: dict[str, Any] = Field(default_factory=dict)
    """Passed through untouched (learning_rate, partial_rollout, ...)."""

    def to_json(self) -> str:
        exclude = {"backend"} if self.backend == "embedded" else set()
        return json.dumps(self.model_dump(mode="json", exclude=exclude), indent=2, sort_keys=True)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path


def job_module() -> str:
    return env_str(JOB_MODULE_ENV) or "dressage.jobs.train"


def train_entrypoint(run_config: str | Path, *, python: str) -> list[str]:
    """``python -m <job module> --run-config RUN.json``."""
    return [python, "-m", job_module(), "--run-config", str(run_config)]
