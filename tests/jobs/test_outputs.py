"""The job's output folder across a resume: its metrics log keeps what the checkpoint covers."""

from __future__ import annotations

from pathlib import Path

import pytest

from dressage.jobs.outputs import RunOutputs
from dressage.reporting.metrics import read_metrics

pytestmark = pytest.mark.unit


def _first_attempt(out: Path) -> None:
    outputs = RunOutputs(out, num_steps=4, proxy=None)
    outputs.evaluation(-1, {"eval/accuracy/calculator": 0.25, "eval/mopd/reverse_kl/all": 1.5})
    for step in range(3):
        outputs.sink.log(step, {"train/loss": float(step)})
    outputs.sink.close()


def test_a_resumed_job_keeps_the_records_its_checkpoint_covers(tmp_path: Path) -> None:
    _first_attempt(tmp_path)  # killed after logging step 2; its checkpoint is step 1's
    outputs = RunOutputs(tmp_path, num_steps=4, proxy=None, resume_step=1)
    assert outputs.evaluation_before_training() == {
        "eval/accuracy/calculator": 0.25,
        "eval/mopd/reverse_kl/all": 1.5,
    }
    outputs.sink.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [-1, 0, 1]


def test_a_fresh_start_drops_an_earlier_attempts_records(tmp_path: Path) -> None:
    _first_attempt(tmp_path)  # killed before its first checkpoint
    outputs = RunOutputs(tmp_path, num_steps=4, proxy=None)
    assert outputs.evaluation_before_training() == {}
    outputs.sink.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == []
