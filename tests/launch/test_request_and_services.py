"""Job requests resolve secrets only at submit time; the service and job contracts line up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dressage.config.run import TrainRunConfig
from dressage.launch.base import LaunchError
from dressage.launch.request import JobRequest
from dressage.launch.services import ENGINE_READY_PREFIX, PROXY_READY_PREFIX, write_secret
from dressage.launch.train_job import job_module, train_entrypoint

pytestmark = pytest.mark.unit


def test_secrets_travel_by_name_or_file_never_in_the_request(tmp_path: Path) -> None:
    key = write_secret(tmp_path / "secrets" / "admin")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert write_secret(key).read_text() == key.read_text()  # a retry keeps the same key
    request = JobRequest(
        launcher="local",
        launcher_options={"root": str(tmp_path)},
        entrypoint=["python", "-V"],
        env={"PLAIN": "1"},
        forward_env=["DRESSAGE_*", "SEARCH_API_KEY", "NOT_SET"],
        secret_env_files={"DRESSAGE_PROXY_ADMIN_KEY": str(key)},
    )
    dumped = request.model_dump_json()
    environ = {"DRESSAGE_A": "a", "DRESSAGE_B": "b", "SEARCH_API_KEY": "s3cret", "OTHER": "x"}
    assert "s3cret" not in dumped and key.read_text() not in dumped
    env = request.spec("sid", environ).env
    assert env == {
        "PLAIN": "1",
        "DRESSAGE_A": "a",
        "DRESSAGE_B": "b",
        "SEARCH_API_KEY": "s3cret",
        "DRESSAGE_PROXY_ADMIN_KEY": key.read_text(),
    }
    gone = request.model_copy(update={"secret_env_files": {"K": str(tmp_path / "missing")}})
    with pytest.raises(LaunchError, match="cannot read K from"):
        gone.spec("sid", environ)


def test_ready_lines_match_the_engine_and_the_proxy() -> None:
    from dressage.engine.cli import READY_PREFIX as engine_prefix
    from dressage.proxy.server import READY_PREFIX as proxy_prefix

    assert (ENGINE_READY_PREFIX, PROXY_READY_PREFIX) == (engine_prefix, proxy_prefix)


def test_run_config_is_the_contract_and_names_the_job_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainRunConfig(
        objective="mopd",
        mopd_config="/c.json",
        student="tiny:seed=0",
        engine_url="http://127.0.0.1:1",
        proxy_url="http://127.0.0.1:2",
        output_dir="/out",
        num_steps=2,
        seed=0,
        rollout_batch_size=4,
        advanced={"learning_rate": 0.001},
    )
    written = json.loads(config.write(tmp_path / "run.json").read_text())
    assert "backend" not in written and written["advanced"] == {"learning_rate": 0.001}
    on_ray = json.loads(config.model_copy(update={"backend": "ray"}).to_json())
    assert on_ray["backend"] == "ray"
    assert job_module() == "dressage.jobs.train"
    monkeypatch.setenv("DRESSAGE_JOB_MODULE", "my.job")
    assert train_entrypoint("/r.json", python="python3") == [
        "python3",
        "-m",
        "my.job",
        "--run-config",
        "/r.json",
    ]


@pytest.mark.integration
def test_services_that_cannot_start_fail_with_their_log_and_leave_nothing_running(
    tmp_path: Path,
) -> None:
    from dressage.launch.local import LocalLauncher
    from dressage.launch.services import ServicePlan, start_services

    (tmp_path / "not-a-model").mkdir()
    launcher = LocalLauncher(tmp_path / "jobs", stop_grace_s=2)
    plan = ServicePlan(
        student=tmp_path / "not-a-model",
        store_dir=tmp_path / "store",
        admin_key_file=tmp_path / "secrets" / "key",
        id_prefix="dressage-test",
        ready_timeout_s=120,
    )
    with pytest.raises(
        LaunchError, match=r"service dressage-test-(engine|proxy) is FAILED"
    ) as info:
        start_services(launcher, plan)
    assert "last lines of its log" in str(info.value)
    for service in ("engine", "proxy"):
        status = launcher.status(f"dressage-test-{service}")
        assert status is None or status.state.terminal
