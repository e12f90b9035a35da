"""The training DAGs through dag.test() on the embedded default, with the contract job.

Real services (the embedded engine and the recording proxy) start and stop around a real job
process; the job is tests/airflow/contract_job.py (selected through DRESSAGE_JOB_MODULE), so
these tests cover the orchestration, not the trainer: launch, deferral, staging, pandera checks,
Assets, and every failure path named by the issue.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest

from dressage.staging import ArtifactError, open_artifact, validate_artifact
from tests.airflow import harness
from tests.staging.read_only import read_only_folder

pytestmark = pytest.mark.integration

CONTRACT_KEYS = {
    "objective",
    "mopd_config",
    "student",
    "engine_url",
    "proxy_url",
    "output_dir",
    "num_steps",
    "seed",
    "rollout_batch_size",
    "advanced",
}


def _conf(tmp_path: Path, artifact_root: Path | None = None, **job: Any) -> dict[str, Any]:
    return {
        "steps": 3,
        "run_root": str(tmp_path / "runs"),
        "artifact_root": str(artifact_root or tmp_path / "artifacts"),
        "poll_seconds": 0.5,
        "extra": {"contract_job": job} if job else {},
    }


def _run_dir(tmp_path: Path, dag_id: str) -> Path:
    (found,) = (tmp_path / "runs" / dag_id).iterdir()
    return found


def _job_states(run_dir: Path) -> dict[str, str]:
    out = {}
    for exit_file in (run_dir / "jobs").glob("*/exit.json"):
        if ".attempt-" not in exit_file.parent.name:  # earlier attempts are kept as evidence
            name = exit_file.parent.name.rsplit("-", 1)[-1]
            out[name] = json.loads(exit_file.read_text())["state"]
    return out


def _logs(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> str:
    captured = capfd.readouterr()
    return caplog.text + captured.out + captured.err


def test_mopd_end_to_end(
    airflow_db: None,
    contract_job: None,
    note_listener: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level("INFO")
    run = harness.run_dag("dressage_mopd", _conf(tmp_path))
    assert run.state == "success", harness.states(run)
    assert set(harness.states(run).values()) == {"success"}
    run_dir = _run_dir(tmp_path, "dressage_mopd")

    staged = harness.xcom(run, "stage")
    url = staged["url"]
    assert url == f"{(tmp_path / 'artifacts').as_uri()}/dressage_mopd/{run_dir.name}"
    manifest = open_artifact(url).manifest
    assert sorted(manifest.metadata["rollouts"]) == [f"rollout-{i:05d}" for i in range(3)]
    assert set(manifest.blobs) == {"metrics.jsonl", "summary.json", "curves.png"}
    assert open_artifact(url).read_blob("curves.png").startswith(b"\x89PNG")
    for name in manifest.metadata["rollouts"]:
        assert validate_artifact(f"{url}/{name}")["ok"]
    for kind in ("segments", "train_data"):
        report = json.loads(
            (Path(url.removeprefix("file://")) / "checks" / f"{kind}.json").read_text()
        )
        assert report["ok"] and report["rows"] == 12

    events = dict(harness.asset_events(run))
    student = events.pop("dressage://mopd/student")
    assert set(events) == {"dressage://mopd/segments", "dressage://mopd/train_data"}
    assert all(e["url"] == url and e["rows"] == 12 for e in events.values())
    # the contract job writes no checkpoint of slime's layout: none is published
    assert student["checkpoint"] is None and student["run_id"] == run.run_id
    assert student["steps"] == 3 and student["parent_run"] is None

    summary = harness.xcom(run, "publish")["summary"]
    assert summary["steps"] == 3 and set(summary["teachers"]) == {"calculator", "lookup"}
    first, last = summary["teachers"]["lookup"]["reverse_kl"]
    assert last < first

    run_json = json.loads((run_dir / "run.json").read_text())
    assert set(run_json) == CONTRACT_KEYS  # the embedded RUN.json carries exactly the contract
    assert run_json["objective"] == "mopd" and run_json["num_steps"] == 3
    assert run_json["proxy_url"].startswith("http://127.0.0.1:")

    on_disk = [p.read_text() for p in run_dir.glob("jobs/*/state.json")] + [json.dumps(run_json)]
    for name in ("proxy_admin_key", "engine_admin_key"):  # the engine's: its control routes
        key_file = run_dir / "secrets" / name
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert key not in harness.all_xcom_text(run) and not any(key in text for text in on_disk)

    assert _job_states(run_dir) == {"engine": "STOPPED", "proxy": "STOPPED", "train": "SUCCEEDED"}
    logs = _logs(caplog, capfd)
    assert "job | step 3/3" in logs  # the job's progress streams through the trigger
    assert "proxy_url healthy" in logs
    assert "engine control key checked" in logs  # the job, the engine and the proxy share it

    # The story: the summary table once, at the end of train's log; no "Returned value was".
    assert logs.count("run summary") == 1 and logs.count("reverse KL (first -> last)") == 1
    assert "Returned value was" not in logs
    note = harness.note(run)
    assert note.startswith("**MOPD, 3 step(s), 2 teacher(s)**")
    assert "| lookup |" in note and "| calculator |" in note
    curves = f"/dressage/curves?dag_id=dressage_mopd&run_id={quote_plus(run.run_id)}"
    assert f"[![curves]({curves})]({curves})" in note and f"Artifacts: `{url}`" in note
    assert all(e["curves"] == curves for e in events.values())
    from airflow.utils.session import create_session

    from dressage.airflow.plugin import curves_png

    with create_session() as session:  # what the plugin's route serves at that address
        assert curves_png(session, "dressage_mopd", run.run_id).startswith(b"\x89PNG")
        with pytest.raises(LookupError, match="has no staged artifacts"):
            curves_png(session, "dressage_mopd", "no-such-run")


def test_failing_job_fails_the_task_with_its_log_tail(
    airflow_db: None,
    contract_job: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level("INFO")
    # exit status 2, the job's "cannot run": failed for good (a crash, any other status, is
    # retried and resumes from its checkpoint: tests/airflow/test_job_trigger.py)
    run = harness.run_dag("dressage_mopd", _conf(tmp_path, fail_at_step=1, fail_exit=2))
    states = harness.states(run)
    assert run.state == "failed"
    assert states["train"] == "failed"
    assert states["stage"] == states["publish"] == "upstream_failed"
    assert states["stop_services"] == "success"  # teardown runs whatever happens
    logs = _logs(caplog, capfd)
    assert "FAILED: exit code 2" in logs
    assert "--- last 40 lines of its log" in logs
    assert "RuntimeError: contract job fails at step 1 as asked" in logs
    assert harness.asset_events(run) == []
    states_on_disk = _job_states(_run_dir(tmp_path, "dressage_mopd"))
    assert states_on_disk == {"engine": "STOPPED", "proxy": "STOPPED", "train": "FAILED"}


def test_failing_pandera_check_stores_its_report_and_publishes_nothing(
    airflow_db: None, contract_job: None, tmp_path: Path
) -> None:
    run = harness.run_dag("dressage_rl", _conf(tmp_path, bad_train_data=True))
    states = harness.states(run)
    assert run.state == "failed"
    assert states["train"] == states["stage"] == states["check_segments"] == "success"
    assert states["check_train_data"] == "failed"
    assert states["publish"] == "upstream_failed"
    assert harness.asset_events(run) == []
    run_json = json.loads((_run_dir(tmp_path, "dressage_rl") / "run.json").read_text())
    assert run_json["objective"] == "grpo" and run_json["advanced"]["partial_rollout"] is True

    url = harness.xcom(run, "stage")["url"]
    report_path = Path(url.removeprefix("file://")) / "checks" / "train_data.json"
    report = json.loads(report_path.read_text())
    assert report["ok"] is False and report["rows"] == 12
    failures = [f for r in report["rollouts"].values() for f in r["failures"]]
    assert {(f["check"], f["column"]) for f in failures} == {
        ("logprobs_finite_nonpositive", "rollout_log_probs")
    }
    assert all(f["count"] == 4 and f["ids"] for f in failures)


def test_read_only_artifact_root_fails_and_stages_nothing(
    airflow_db: None,
    contract_job: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level("INFO")
    with read_only_folder(tmp_path / "read-only") as root:
        run = harness.run_dag("dressage_mopd", _conf(tmp_path, artifact_root=root, step_sleep_s=0))
        states = harness.states(run)
        assert run.state == "failed"
        assert states["train"] == "success" and states["stage"] == "failed"
        assert states["check_segments"] == states["publish"] == "upstream_failed"
        assert list(root.iterdir()) == []
        with pytest.raises(ArtifactError):
            open_artifact(f"{root.as_uri()}/dressage_mopd/x")
    logs = _logs(caplog, capfd)
    assert f"staging to {root.as_uri()}/dressage_mopd/" in logs
    assert "cannot write to" in logs and "Operation not permitted" in logs
    assert harness.asset_events(run) == []


def test_an_unreachable_ray_address_fails_validation_naming_it(
    airflow_db: None, tmp_path: Path
) -> None:
    from tests.helpers import free_port

    address = f"http://127.0.0.1:{free_port()}"
    run = harness.run_dag(
        "dressage_mopd", {**_conf(tmp_path), "backend": "ray", "ray_address": address}
    )
    states = harness.states(run)
    assert run.state == "failed" and states["validate"] == "failed"
    assert states["start_services"] == states["train"] == "upstream_failed"
    report = json.loads((_run_dir(tmp_path, "dressage_mopd") / "preflight.json").read_text())
    (problem,) = report["problems"]
    assert problem["subject"] == "ray_address"
    assert f"the Ray dashboard at {address} is unreachable" in problem["message"]


def test_values_the_form_cannot_check_fail_the_plan_in_one_sentence_and_the_note(
    airflow_db: None,
    note_listener: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level("INFO")
    conf = {**_conf(tmp_path), "steps": 0, "artifact_root": "http://host/x"}
    run = harness.run_dag("dressage_mopd", conf)
    states = harness.states(run)
    assert run.state == "failed" and states["plan"] == "failed"
    assert states["validate"] == states["train"] == "upstream_failed"
    steps = "Training steps (steps) is 0: enter a whole number from 1 to 1,000,000."
    root = "Artifact root (artifact_root) is 'http://host/x': enter a folder or a file://"
    note = harness.note(run)
    assert note.startswith("**plan failed**: 2 values of the trigger form to fix:")
    assert f"- {steps}" in note and f"- {root}" in note.replace("\\", "")
    logs = _logs(caplog, capfd)
    assert logs.index(steps) < logs.index("Task failed with exception")  # the reason first


def test_grpo_run_tells_reward_pass_rate_and_advantages(
    airflow_db: None,
    contract_job: None,
    note_listener: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level("INFO")
    run = harness.run_dag("dressage_rl", {**_conf(tmp_path, step_sleep_s=0), "steps": 2})
    assert run.state == "success", harness.states(run)
    logs = _logs(caplog, capfd)
    assert "pass rate (first -> last step)" in logs and "teachers:" not in logs
    assert "advantages: 8 trajectories, mean +0.5000" in logs  # the contract job's rewards
    note = harness.note(run)
    assert note.startswith("**GRPO, 2 step(s)**: reward 0.500 → 0.500")
    # the contract job groups GRPO trajectories as one task, "all"
    assert "| all | 0% → 25% |" in note and "/dressage/curves?dag_id=dressage_rl" in note
    summary = harness.xcom(run, "publish")["summary"]
    assert summary["objective"] == "grpo" and summary["pass_rate"] == {"all": [0.0, 0.25]}


def test_job_settings_the_job_would_refuse_fail_the_plan_before_anything_is_launched(
    airflow_db: None, note_listener: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DRESSAGE_JOB_MODULE", raising=False)  # the project's own job
    extra = {"n_samples_per_prompt": 4, "num_steps_per_rollout": 3}
    run = harness.run_dag("dressage_rl", {**_conf(tmp_path), "extra": extra})
    states = harness.states(run)
    assert run.state == "failed" and states["plan"] == "failed"
    assert states["start_services"] == states["train"] == "upstream_failed"
    # 4 prompts (the form's default) x 4 samples do not split into 3 optimizer steps
    assert (
        harness.note(run)
        .replace("\\", "")
        .startswith(
            "**plan failed**: More job settings (extra): num_steps_per_rollout 3 does not divide a "
            "rollout's 16 trajectories"
        )
    )
    assert not list((tmp_path / "runs").rglob("run.json"))  # nothing was prepared
