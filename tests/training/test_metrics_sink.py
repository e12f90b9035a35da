"""Run metrics: the JSONL log beside a run's artifacts always, W&B only when enabled."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dressage.reporting.metrics import read_metrics
from dressage.training.metrics_sink import MetricsSink, WandbSettings, log_rollout_metrics
from dressage.types import Sample

pytestmark = pytest.mark.unit


def test_jsonl_has_one_record_per_step_and_needs_no_wandb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # any import of wandb would now fail
    path = tmp_path / "metrics" / "train.jsonl"
    with MetricsSink(path) as sink:
        sink.log(0, {"loss": 0.5, "n": 3, "flag": True}, at=100.0)
        sink.log(1, {"loss": math.nan, "kl": math.inf})
    records = read_metrics(path)
    assert records[0] == {"step": 0, "time": 100.0, "metrics": {"flag": 1, "loss": 0.5, "n": 3}}
    assert records[1]["step"] == 1 and records[1]["metrics"] == {"kl": None, "loss": None}
    with MetricsSink(path) as sink:  # appends: a resumed run keeps its history
        sink.log(2, {"loss": 0.25})
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]


def test_a_resumed_run_drops_the_records_after_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsSink(path) as sink:
        for step in (-1, 0, 1, 1, 2, 3):  # step 1: a training and an eval record
            sink.log(step, {"loss": step})
    with path.open("a") as handle:
        handle.write('{"step": 4, "metr')  # torn by the crash
    with MetricsSink(path, keep_through=1) as sink:  # resumed from the checkpoint of step 1
        sink.log(2, {"loss": 20})
    assert [(r["step"], r["metrics"]["loss"]) for r in read_metrics(path)] == [
        (-1, -1),
        (0, 0),
        (1, 1),
        (1, 1),
        (2, 20),
    ]


def test_enabled_wandb_without_the_package_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(RuntimeError, match="wandb is not installed"):
        MetricsSink(tmp_path / "m.jsonl", wandb=WandbSettings("proj"))


def test_enabled_wandb_mirrors_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class _Run:
        def log(self, values: dict[str, Any], step: int) -> None:
            calls.append(("log", (step, values)))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: Any) -> _Run:
        calls.append(("init", kwargs))
        return _Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    settings = WandbSettings("proj", group="grp", run_name="r1")
    with MetricsSink(tmp_path / "m.jsonl", wandb=settings, config={"lr": 1e-6}) as sink:
        sink.log(4, {"loss": 1.0, "bad": math.nan})
    assert calls[0][0] == "init"
    assert {k: calls[0][1][k] for k in ("project", "group", "name", "config")} == {
        "project": "proj",
        "group": "grp",
        "name": "r1",
        "config": {"lr": 1e-6},
    }
    assert calls[1:] == [("log", (4, {"loss": 1.0})), ("finish", None)]
    assert read_metrics(tmp_path / "m.jsonl")[0]["metrics"] == {"bad": None, "loss": 1.0}


def _sample(teacher: str, reward: float, length: int, status: str) -> Sample:
    sample = Sample(reward=reward, response_length=length, metadata={"teacher_id": teacher})
    sample.status = Sample.Status(status)
    return sample


def test_rollout_log_hook_writes_beside_the_run_and_keeps_slime_logging(tmp_path: Path) -> None:
    args = types.SimpleNamespace(mopd_metrics_dir=str(tmp_path / "metrics"))
    groups = [
        [_sample("calc", 1.0, 10, "completed")],
        [_sample("look", 0.0, 30, "truncated"), _sample("look", 0.5, 20, "completed")],
    ]
    assert log_rollout_metrics(7, args, groups, {"dropped": 2, "note": "x"}, 3.5) is False
    (record,) = read_metrics(tmp_path / "metrics" / "rollout.jsonl")
    assert record["step"] == 7
    assert record["metrics"] == {
        "rollout/n_samples": 3,
        "rollout/time_s": 3.5,
        "rollout/truncated_frac": pytest.approx(1 / 3),
        "rollout/reward_mean": 0.5,
        "rollout/response_length_mean": 20.0,
        "rollout/teacher/calc/n_samples": 1,
        "rollout/teacher/look/n_samples": 2,
        "rollout/extra/dropped": 2,
    }
    assert log_rollout_metrics(8, types.SimpleNamespace(), groups, None, 1.0) is False
