"""The Assets the training DAGs publish, one per table kind and objective.

A DAG downstream of training data schedules on them (``schedule=[MOPD_TRAIN_DATA]``) and finds
the staged run in the event's extra: ``url`` (the run), ``report`` (the pandera report),
``rollouts``, ``rows``, ``run_id``. Events are emitted only after the checks of that table pass.
"""

from __future__ import annotations

from airflow.sdk import Asset

__all__ = ["ASSETS", "MOPD_SEGMENTS", "MOPD_TRAIN_DATA", "RL_SEGMENTS", "RL_TRAIN_DATA"]

MOPD_SEGMENTS = Asset(
    name="dressage_mopd_segments", uri="dressage://mopd/segments", group="dressage"
)
MOPD_TRAIN_DATA = Asset(
    name="dressage_mopd_train_data", uri="dressage://mopd/train_data", group="dressage"
)
RL_SEGMENTS = Asset(name="dressage_rl_segments", uri="dressage://rl/segments", group="dressage")
RL_TRAIN_DATA = Asset(
    name="dressage_rl_train_data", uri="dressage://rl/train_data", group="dressage"
)

ASSETS: dict[str, dict[str, Asset]] = {
    "mopd": {"segments": MOPD_SEGMENTS, "train_data": MOPD_TRAIN_DATA},
    "grpo": {"segments": RL_SEGMENTS, "train_data": RL_TRAIN_DATA},
}
