"""The Ray Jobs launcher, JobTrigger and the MOPD DAG's ray backend against a real Ray head.

One head per module (``ray start --head --block`` in its own process group, every port free and
on 127.0.0.1 where Ray allows, RAY_AUTH_MODE=disabled, a short temp dir); it is stopped by
signalling that group, never with ``ray stop`` (which would stop every Ray on the machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.airflow.triggers import JobTrigger
from dressage.launch.base import JobSpec, JobState, LaunchError, launcher_for
from dressage.launch.ray_jobs import RayJobsLauncher
from tests.helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("embedded_checkpoints")]

PY = sys.executable


def _wait_for_jobs_api(address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{address}/api/jobs/", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Ray's Jobs API at {address} did not come up:\n{log.read_text()[-3000:]}")


def _start_head(ray: Path, temp: Path) -> tuple[subprocess.Popen[bytes], str]:
    flags = [
        "--port",
        "--dashboard-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
        "--node-manager-port",
        "--object-manager-port",
        "--ray-client-server-port",
    ]
    ports = {flag: free_port() for flag in flags}
    argv = [str(ray), "start", "--head", "--block", "--num-cpus=2", "--disable-usage-stats"]
    argv += ["--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--temp-dir={temp}"]
    argv += [f"{flag}={port}" for flag, port in ports.items()]
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "PATH": f"{Path(PY).parent}:{os.environ['PATH']}",
    }
    with open(temp / "head.log", "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return proc, f"http://127.0.0.1:{ports['--dashboard-port']}"


def _stop_head(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            time.sleep(0.5)  # the group's other processes end with their leader
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray = Path(PY).parent / "ray"
    if not ray.exists():
        pytest.skip("ray is not installed in this environment")
    temp = Path(tempfile.mkdtemp(prefix="dray", dir="/tmp"))  # Ray's socket paths must be short
    proc = None
    try:
        for attempt in range(3):  # a port can still be taken between the check and Ray's bind
            proc, address = _start_head(ray, temp)
            try:
                _wait_for_jobs_api(address, proc, temp / "head.log")
                break
            except RuntimeError as exc:
                _stop_head(proc)
                if "already occupied" not in str(exc) or attempt == 2:
                    raise
        yield address
    finally:
        if proc is not None:
            _stop_head(proc)
        time.sleep(1.0)  # let the killed processes' files close before removing their folder
        shutil.rmtree(temp, ignore_errors=True)


def _events(trigger: JobTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def _trigger(launcher: RayJobsLauncher, sid: str, **kwargs: Any) -> JobTrigger:
    return JobTrigger(
        launcher="ray", launcher_options=launcher.options(), submission_id=sid, poll_s=0.5, **kwargs
    )


def _jobs_named(address: str, sid: str) -> int:
    jobs = httpx.get(f"{address}/api/jobs/", timeout=10).json()
    return sum(1 for job in jobs if job.get("submission_id") == sid)


def test_a_small_job_runs_through_the_launcher_and_the_trigger(
    ray_address: str, tmp_path: Path
) -> None:
    launcher = launcher_for("ray", {"address": ray_address})
    assert isinstance(launcher, RayJobsLauncher)
    (tmp_path / "work").mkdir()
    code = "import os; print('hello from ray', os.environ['DRESSAGE_X'], os.getcwd())"
    spec = JobSpec(
        [PY, "-c", code],
        submission_id="dressage-test-ok",
        env={"DRESSAGE_X": "forwarded"},
        working_dir=str(tmp_path / "work"),
    )
    submitted = launcher.submit(spec)
    assert not submitted.reattached and submitted.log.endswith("#/jobs/dressage-test-ok")
    again = launcher.submit(spec)  # a retried task: no second job under this id
    assert again.reattached and _jobs_named(ray_address, "dressage-test-ok") == 1
    (event,) = _events(_trigger(launcher, "dressage-test-ok"))
    assert event["state"] == "SUCCEEDED" and event["exit_code"] == 0
    assert f"hello from ray forwarded {tmp_path / 'work'}" in launcher.logs("dressage-test-ok")
    finished = launcher.submit(spec)
    assert finished.reattached and finished.state == JobState.SUCCEEDED
    assert _jobs_named(ray_address, "dressage-test-ok") == 1


def test_a_failing_job_is_failed_with_its_log_and_a_retry_is_a_new_attempt(
    ray_address: str,
) -> None:
    launcher = RayJobsLauncher(ray_address)
    spec = JobSpec([PY, "-c", "print('about to fail'); raise SystemExit(5)"], "dressage-test-bad")
    launcher.submit(spec)
    (event,) = _events(_trigger(launcher, "dressage-test-bad"))
    assert event["state"] == "FAILED"
    assert "about to fail" in launcher.logs("dressage-test-bad", tail=20)
    fixed = JobSpec([PY, "-c", "print('second attempt')"], "dressage-test-bad")
    retry = launcher.submit(fixed)
    assert not retry.reattached and retry.submission_id == "dressage-test-bad-r1"
    (event,) = _events(_trigger(launcher, "dressage-test-bad"))  # the base id: latest attempt
    assert event["state"] == "SUCCEEDED" and event["submission_id"] == "dressage-test-bad-r1"
    assert "second attempt" in launcher.logs("dressage-test-bad")
    assert _jobs_named(ray_address, "dressage-test-bad") == 1  # the failed attempt is kept
    again = launcher.submit(fixed)
    assert again.reattached and again.submission_id == "dressage-test-bad-r1"
    assert _jobs_named(ray_address, "dressage-test-bad-r1") == 1


def test_stop_and_the_trigger_see_a_stopped_job(ray_address: str) -> None:
    launcher = RayJobsLauncher(ray_address, stop_grace_s=30)
    code = "import time; print('running', flush=True); time.sleep(120)"
    launcher.submit(JobSpec([PY, "-c", code], "dressage-test-stop"))
    deadline = time.monotonic() + 60
    while launcher.status("dressage-test-stop").state != JobState.RUNNING:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.5)
    (timeout,) = _events(_trigger(launcher, "dressage-test-stop", deadline=time.time() + 1))
    assert timeout["state"] == "TIMEOUT"
    asyncio.run(_trigger(launcher, "dressage-test-stop").on_kill())
    (event,) = _events(_trigger(launcher, "dressage-test-stop"))
    assert event["state"] == "STOPPED"
    assert launcher.stop("dressage-test-stop").state == JobState.STOPPED  # type: ignore[union-attr]


def test_unknown_ids_and_an_unreachable_address(ray_address: str) -> None:
    launcher = RayJobsLauncher(ray_address)
    assert launcher.status("dressage-never-submitted") is None
    assert launcher.stop("dressage-never-submitted") is None
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(LaunchError, match=f"the Ray dashboard at {closed} is unreachable"):
        RayJobsLauncher(closed, timeout_s=2).submit(JobSpec(["true"], "dressage-x"))


def test_the_mopd_dag_runs_its_job_on_ray(
    ray_address: str, airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backend=ray: no local services, the job goes through the Jobs API with the DRESSAGE_*
    variables and the config's runtime_env_keys in its runtime env; staging and checks follow."""
    from tests.airflow import harness

    config = json.loads((harness.REPO / "configs/mopd/embedded.json").read_text())
    for ds in config["datasets"]:
        ds["path"] = str(harness.REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(harness.REPO / "configs/mopd" / ds["eval_path"])
    config["runtime_env_keys"] = ["PYTHONPATH"]  # the Ray job imports the contract job by it
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    monkeypatch.setenv("DRESSAGE_JOB_MODULE", "tests.airflow.contract_job")
    monkeypatch.setenv("PYTHONPATH", str(harness.REPO))
    conf = {
        "backend": "ray",
        "ray_address": ray_address,
        "ray_python": PY,
        "mopd_config": str(tmp_path / "mopd.json"),
        "steps": 2,
        "run_root": str(tmp_path / "runs"),
        "artifact_root": str(tmp_path / "artifacts"),
        "poll_seconds": 0.5,
    }
    run = harness.run_dag("dressage_mopd", conf)
    assert run.state == "success", harness.states(run)
    assert harness.xcom(run, "start_services")["launcher"] is None
    job = harness.xcom(run, "train")
    assert job["submission_id"].startswith("dressage-dressage_mopd-manual") and job[
        "log"
    ].startswith(ray_address)
    info = httpx.get(f"{ray_address}/api/jobs/{job['submission_id']}", timeout=10).json()
    env_vars = info["runtime_env"]["env_vars"]
    assert env_vars["DRESSAGE_JOB_MODULE"] == "tests.airflow.contract_job"
    assert env_vars["PYTHONPATH"] == str(harness.REPO)
    staged = harness.xcom(run, "stage")
    assert len(staged["rollouts"]) == 2
    assert {uri for uri, _ in harness.asset_events(run)} == {
        "dressage://mopd/segments",
        "dressage://mopd/train_data",
        "dressage://mopd/student",
    }
