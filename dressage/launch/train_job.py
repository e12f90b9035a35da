"""The training job's contract: its run config (RUN.json), its command and what it writes.

    python -m dressage.jobs.train --run-config RUN.json

RUN.json is a :class:`~dressage.config.run.TrainRunConfig`. The job reads the proxy's admin key from
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

from pathlib import Path

from dressage.config.env import env_str

__all__ = ["DEFAULT_JOB_MODULE", "JOB_MODULE_ENV", "job_module", "train_entrypoint"]

JOB_MODULE_ENV = "DRESSAGE_JOB_MODULE"
DEFAULT_JOB_MODULE = "dressage.jobs.train"  # the declared default (dressage.config.env)


def job_module() -> str:
    """``DRESSAGE_JOB_MODULE``, or its declared default (an empty value reads as unset)."""
    module = env_str(JOB_MODULE_ENV)  # the declared default when unset or empty
    return DEFAULT_JOB_MODULE if module is None else module


def train_entrypoint(run_config: str | Path, *, python: str) -> list[str]:
    """``python -m <job module> --run-config RUN.json``."""
    return [python, "-m", job_module(), "--run-config", str(run_config)]
