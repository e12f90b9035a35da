"""A resubmitted job logs to the W&B run its first submission started
(:func:`dressage.slime.tracking.keep_wandb_run`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dressage.slime.tracking import RUN_ID_FILE, keep_wandb_run

pytestmark = pytest.mark.unit


def test_every_launch_of_one_job_continues_one_run(tmp_path: Path) -> None:
    args = SimpleNamespace(use_wandb=True, save=str(tmp_path / "checkpoints"))
    first: dict[str, str] = {}
    run_id = keep_wandb_run(args, first)
    assert run_id is not None and len(run_id) == 8 and run_id.isalnum()
    assert first == {"WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow"}
    assert (tmp_path / "checkpoints" / RUN_ID_FILE).read_text().strip() == run_id
    again: dict[str, str] = {}  # the resubmitted job: a new process, the same save folder
    assert keep_wandb_run(args, again) == run_id and again == first
    other = SimpleNamespace(use_wandb=True, save=str(tmp_path / "other" / "checkpoints"))
    assert keep_wandb_run(other, {}) != run_id  # a run of its own (continue_from included)


def test_the_users_run_id_wins_and_no_wandb_sets_nothing(tmp_path: Path) -> None:
    args = SimpleNamespace(use_wandb=True, save=str(tmp_path))
    env = {"WANDB_RUN_ID": "mine", "WANDB_RESUME": "must"}
    assert keep_wandb_run(args, env) == "mine"
    assert env == {"WANDB_RUN_ID": "mine", "WANDB_RESUME": "must"}
    assert not (tmp_path / RUN_ID_FILE).exists()
    for off in (SimpleNamespace(use_wandb=False, save=str(tmp_path)),
                SimpleNamespace(use_wandb=True, save=None)):  # fmt: skip
        env = {}
        assert keep_wandb_run(off, env) is None and env == {}
