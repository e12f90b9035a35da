"""``python -m dressage.jobs.train`` as the training DAGs run it: a real engine and proxy (as their
setup task starts them), RUN.json, the admin key in the environment; a short MOPD run whose
outputs then go through the DAG's own staging and pandera checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.config.proxy import ProxyConfig
from dressage.config.run import TrainRunConfig
from dressage.engine.testing import serve_engine
from dressage.jobs.train import main
from dressage.proxy.testing import serve_proxy
from dressage.staging import open_artifact
from dressage.staging.checks import check_run_tables
from dressage.staging.stage import stage_run
from dressage.tiny.checkpoints import resolve_checkpoint
from tests.helpers import ENGINE_KEY, REPO

pytestmark = pytest.mark.integration

ADMIN = "admin-key-for-the-job-test"
KEYS = {"DRESSAGE_PROXY_ADMIN_KEY": ADMIN, "DRESSAGE_ENGINE_ADMIN_KEY": ENGINE_KEY}
STEPS = 3
DATA = REPO / "configs" / "mopd" / "data"


def _held_out_rows(root: Path, task: str, rows: int = 4) -> str:
    """The first ``rows`` held-out rows of ``task`` (the agent loop on 16 a task, three times a
    run, with the 248k-vocabulary test student, is most of a short run's time)."""
    path = root / f"{task}.eval.jsonl"
    path.write_text("".join((DATA / f"{task}.eval.jsonl").read_text().splitlines(True)[:rows]))
    return str(path)


def _mopd_config(root: Path, *, held_out: bool = False) -> Path:
    held = {task: {"eval_path": _held_out_rows(root, task)} if held_out else {}
            for task in ("calculator", "lookup")}  # fmt: skip
    config = {
        "student": {"hf_checkpoint": "tiny:seed=0"},
        "teachers": {"calculator": {"load": "tiny:seed=1"}, "lookup": {"load": "tiny:seed=2"}},
        "datasets": [
            {
                "name": task,
                "path": str(DATA / f"{task}.jsonl"),
                "teacher_id": task,
                "weight": 1.0,
                "agent_mode": "blackbox",
                "task": task,
                **held[task],
            }
            for task in ("calculator", "lookup")
        ],  # fmt: skip
        "reward_modules": ["dressage.reward.builtin"],
    }
    path = root / "mopd.json"
    path.write_text(json.dumps(config))
    return path


def _run_job(run: TrainRunConfig, root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = run.write(root / "run.json")
    return subprocess.run(
        [sys.executable, "-m", "dressage.jobs.train", "--run-config", str(path)],
        cwd=REPO,
        env={**os.environ, **KEYS, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    student = resolve_checkpoint("tiny:seed=0")
    store = tmp_path_factory.mktemp("proxy-store")
    with serve_engine(
        student, device="cpu", num_threads=1, weight_version="0", admin_api_key=ENGINE_KEY
    ) as engine_url:
        config = ProxyConfig(
            engine_url=engine_url,
            store_dir=store,
            admin_key=ADMIN,
            engine_admin_key=ENGINE_KEY,
            tokenizer_path=str(student),
            partial_rollout=True,
            record_token_versions=True,
        )
        with serve_proxy(config) as proxy_url:
            yield engine_url, proxy_url


def _run_config(root: Path, services: tuple[str, str], **advanced: Any) -> TrainRunConfig:
    return TrainRunConfig(
        objective="mopd",
        mopd_config=str(_mopd_config(root)),
        student="tiny:seed=0",
        engine_url=services[0],
        proxy_url=services[1],
        output_dir=str(root / "output"),
        num_steps=STEPS,
        seed=3,
        rollout_batch_size=2,
        advanced={
            "partial_rollout": True,
            "learning_rate": 1e-4,
            "device": "cpu",
            "max_response_len": 24,
            "agent_max_turns": 2,
            "groups_in_flight": 3,
            **advanced,
        },
    )


def test_a_short_mopd_run_writes_what_the_dags_stage_and_check(
    services: tuple[str, str], tmp_path: Path
) -> None:
    run = _run_config(tmp_path, services, eval_interval=2).model_copy(
        update={"mopd_config": str(_mopd_config(tmp_path, held_out=True))}
    )
    done = _run_job(run, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for step in range(1, STEPS + 1):
        assert any(line.startswith(f"step {step}/{STEPS} reverse_kl=") for line in lines), lines
    assert lines[-1] == f"done: {STEPS} steps, weight version {STEPS + 1}"

    output = Path(run.output_dir)
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/mopd_reverse_kl" in r["metrics"]] == list(
        range(STEPS)
    )
    # the held-out reverse KL where the held-out accuracy is measured (before training,
    # --eval-interval 2: after step 2) and after the last step, not after every step
    probed = [r["step"] for r in records if "eval/mopd/reverse_kl/all" in r["metrics"]]
    assert probed == [-1, 1, STEPS - 1], probed
    records = [r for r in records if "train/mopd_reverse_kl" in r["metrics"]]
    teachers_seen = set()
    for record in records:
        metrics = record["metrics"]
        assert metrics["train/mopd_reverse_kl"] is not None
        for key in metrics:
            if key.startswith("rollout/mopd/opd_reverse_kl_train_aggregation_mean/"):
                teachers_seen.add(key.rsplit("/", 1)[1])
                teacher = key.rsplit("/", 1)[1]
                assert f"rollout/mopd/raw_reward_trainable_trajectory_mean/{teacher}" in metrics
        assert metrics["pause/paused"] == 1.0 and "pause/latency_s" in metrics
    assert teachers_seen and teachers_seen <= {"calculator", "lookup"}

    summary = json.loads((output / "summary.json").read_text())
    assert summary["weight_version"] == STEPS + 1 and summary["weight_updates"] == STEPS + 1
    assert summary["teachers"] == ["calculator", "lookup"]
    checkpoints = output / "checkpoints"  # slime's layout; the last step's is the latest
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == f"{STEPS - 1}\n"
    assert (checkpoints / f"iter_{STEPS - 1:07d}" / "model" / "config.json").is_file()
    info = httpx.get(f"{services[0]}/model_info").json()
    assert info["weight_version"] == str(STEPS + 1), "the engine serves the trained weights"

    for step in range(STEPS):
        artifact = open_artifact((output / "artifacts" / f"rollout-{step:05d}").as_uri())
        samples = artifact.read_table("samples")
        assert samples.num_rows >= 2
        assert artifact.read_table("train_data").num_rows == samples.num_rows
        assert artifact.read_table("segments").num_rows >= 1
        assert artifact.read_table("steps").num_rows >= 1
    staged = stage_run(str(output), (tmp_path / "staged").as_uri(), metadata={"steps": STEPS})
    for kind in ("segments", "samples", "train_data"):
        result = check_run_tables(str(staged.url), kind)
        assert result["ok"], result
        assert len(result["rollouts"]) == STEPS


def test_rerunning_the_job_on_its_output_dir_resumes_from_its_checkpoint(
    services: tuple[str, str], tmp_path: Path
) -> None:
    first = _run_config(tmp_path, services, save_interval=1).model_copy(update={"num_steps": 2})
    done = _run_job(first, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = Path(first.output_dir)
    done = _run_job(first.model_copy(update={"num_steps": 3}), tmp_path)  # one step more
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed = f"resuming from {output / 'checkpoints' / 'iter_0000001'}: step 3/3"
    assert resumed in done.stdout.splitlines(), done.stdout[-3000:]
    assert not any(line.startswith(("step 1/", "step 2/")) for line in done.stdout.splitlines())
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/mopd_reverse_kl" in r["metrics"]] == [0, 1, 2]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["resumed_from"] == 1 and summary["steps"] == 3
    tracker = output / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text() == "2\n"


def test_a_short_grpo_run_with_the_synchronous_rollout(
    services: tuple[str, str], tmp_path: Path
) -> None:
    run = _run_config(tmp_path, services, partial_rollout=False, n_samples_per_prompt=2).model_copy(
        update={"objective": "grpo", "num_steps": 2}
    )
    done = _run_job(run, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = Path(run.output_dir)
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        metrics = record["metrics"]
        assert metrics["train/pg_loss"] is not None
        assert not any(k.startswith(("train/mopd", "rollout/mopd/")) for k in metrics)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["objective"] == "grpo" and summary["teachers"] == []
    samples = open_artifact((output / "artifacts" / "rollout-00001").as_uri()).read_table("samples")
    assert samples.num_rows >= 4  # 2 prompts x 2 samples per prompt


def test_a_run_config_that_cannot_run_exits_2(
    services: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(config: TrainRunConfig) -> tuple[int, str]:
        code = main(["--run-config", str(config.write(tmp_path / "run.json"))])
        return code, capsys.readouterr().err

    for name, key in KEYS.items():
        monkeypatch.setenv(name, key)
    code, err = run(_run_config(tmp_path, services, learning_rat=1e-4))
    assert (
        code == 2
        and "advanced.learning_rat is not a known key (did you mean 'learning_rate'?)" in err
    )
    on_ray = _run_config(tmp_path, services, cluster={"extra_args": ["--use-kl-loss"]})
    code, err = run(on_ray.model_copy(update={"backend": "ray"}))
    assert code == 2 and "--use-kl-loss" in err  # MOPD's own checks, before anything starts
    down = _run_config(tmp_path, services).model_copy(update={"proxy_url": "http://127.0.0.1:9"})
    code, err = run(down)
    assert code == 2 and "proxy at http://127.0.0.1:9 is unreachable" in err
    monkeypatch.setenv("DRESSAGE_ENGINE_ADMIN_KEY", "")
    code, err = run(_run_config(tmp_path, services))
    assert code == 2 and "DRESSAGE_ENGINE_ADMIN_KEY is set but empty" in err
    monkeypatch.delenv("DRESSAGE_ENGINE_ADMIN_KEY")
    code, err = run(_run_config(tmp_path, services))
    assert code == 2 and "DRESSAGE_ENGINE_ADMIN_KEY is not set" in err  # the weight updates
    monkeypatch.setenv("DRESSAGE_PROXY_ADMIN_KEY", "")
    code, err = run(_run_config(tmp_path, services))
    assert code == 2 and "DRESSAGE_PROXY_ADMIN_KEY is not set" in err
    assert not (tmp_path / "output").exists(), "nothing ran"


def test_held_out_accuracy_before_training_at_the_eval_interval_and_after_the_last_step(
    services: tuple[str, str], tmp_path: Path
) -> None:
    run = _run_config(
        tmp_path, services, partial_rollout=False, n_samples_per_prompt=2, eval_interval=2
    ).model_copy(
        update={
            "objective": "grpo",
            "mopd_config": str(_mopd_config(tmp_path, held_out=True)),
        }
    )
    done = _run_job(run, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    evals = [line for line in lines if line.startswith("held-out accuracy ")]
    assert [e.split(":")[0] for e in evals] == [
        "held-out accuracy before training",
        f"held-out accuracy after step 2/{STEPS}",  # --eval-interval 2: the driver's pass
        f"held-out accuracy after step {STEPS}/{STEPS}",  # the job's own, after the last step
    ]
    output = Path(run.output_dir)
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    accuracy = [r for r in records if "eval/accuracy/all" in r["metrics"]]
    assert [r["step"] for r in accuracy] == [-1, 1, STEPS - 1]
    for record in accuracy:
        metrics = record["metrics"]
        assert set(metrics) >= {"eval/accuracy/calculator", "eval/accuracy/lookup"}
        assert all(0.0 <= metrics[f"eval/accuracy/{t}"] <= 1.0 for t in ("calculator", "lookup"))
        assert not any(k.startswith("eval/accuracy_errors/") for k in metrics), metrics
    assert [r["step"] for r in records if "train/pg_loss" in r["metrics"]] == list(range(STEPS))
    summary = json.loads((output / "summary.json").read_text())
    assert summary["heldout_accuracy_initial"] == accuracy[0]["metrics"]
