"""The Assets the training DAGs publish: one per table kind and objective, and the student.

A DAG downstream of training data schedules on them (``schedule=[MOPD_TRAIN_DATA]``) and finds
the staged run in the event's extra: ``url`` (the run), ``report`` (the pandera report),
``rollouts``, ``rows``, ``run_id``. Events are emitted only after the checks of that table pass.

The student Assets (``dressage_mopd_student``, ``dressage_rl_student``) carry the trained
student: ``checkpoint`` (the ``file://`` URL of its last checkpoint, or None when the job wrote
none), ``steps``, ``accuracy`` (held-out, per task, after the last step), ``parent_run`` (the run
it continued, or None), ``dag_id`` and ``run_id``. A training DAG's ``continue_from=latest``
starts from the newest of its own events that has a checkpoint.
"""

from __future__ import annotations

from airflow.sdk import Asset

__all__ = [
    "ASSETS",
    "MOPD_SEGMENTS",
    "MOPD_STUDENT",
    "MOPD_TRAIN_DATA",
    "RL_SEGMENTS",
    "RL_STUDENT",
    "RL_TRAIN_DATA",
    "STUDENTS",
]

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

MOPD_STUDENT = Asset(name="dressage_mopd_student", uri="dressage://mopd/student", group="dressage")
RL_STUDENT = Asset(name="dressage_rl_student", uri="dressage://rl/student", group="dressage")

STUDENTS: dict[str, Asset] = {"mopd": MOPD_STUDENT, "grpo": RL_STUDENT}
