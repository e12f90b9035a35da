"""slime's train-side rollout logging on what the project's converter hands slime's trainer.

Under slime, the rollout data of every step goes through slime's ``log_rollout_data``
(slime/observability/train_metric_utils.py) in the Megatron actor, which averages every key it
does not know. The batch here is real slime Samples through the project's segment expansion and
converter, slime's DP split (``_split_train_data_by_dp``) and slime's ``process_rollout_data``,
for GRPO with the stock actor (datasets that name teachers, as MOPD configs do), with one
gloo process and megatron-core's parallel state. The MOPD actor's own path is
tests/real_slime/test_mopd_actor.py.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_train_side_logging.py
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.real_slime.slime_parts import SPLIT_AND_LOGGING_ARGS, split_per_rank
from tests.rollout.factories import slime_args, template, trajectory

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("megatron_world")]


def _rank_data(args: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from dressage.rollout.convert_samples import convert_samples_to_train_data

    samples: list[Any] = []
    for index, (teacher, split) in enumerate([("calc", [3]), ("look", [2, 4]), ("look", [5])]):
        samples += trajectory(
            args, template(index, index, teacher_id=teacher), split, reward=float(index % 2)
        )
    (rank,) = split_per_rank(args, convert_samples_to_train_data(args, samples), 1, monkeypatch)
    return rank


def test_grpo_rollout_data_is_logged_by_slimes_train_side_logging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slime.observability import logging_utils, train_metric_utils

    args = slime_args(
        advantage_estimator="grpo",
        n_samples_per_prompt=1,
        rollout_batch_size=3,
        global_batch_size=3,
        micro_batch_size=1,
        **SPLIT_AND_LOGGING_ARGS,
    )
    data = _rank_data(args, monkeypatch)
    logged: list[dict[str, Any]] = []
    monkeypatch.setattr(logging_utils, "log", lambda a, metrics, step_key: logged.append(metrics))
    train_metric_utils.log_rollout_data(0, args, data)
    (metrics,) = logged
    assert {"rollout/rewards", "rollout/raw_reward", "rollout/response_lengths"} <= set(metrics)
