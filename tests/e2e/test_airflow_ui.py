"""`make airflow` (scripts/airflow.sh): Airflow standalone on loopback with the dressage DAGs,
driven through its public REST API as the UI's trigger form drives it: sign in with the generated
admin password, list the DAGs, reject a trigger whose Params break the schema, run
dressage_validate, and run a one-step dressage_mopd with the real training job under the real
scheduler, LocalExecutor and triggerer (the deferred training task)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import REPO, free_port

pytestmark = pytest.mark.integration

DAG_IDS = ["dressage_mopd", "dressage_rl", "dressage_validate"]

_api = httpx.Client(timeout=60)
"""Every API call's client: the api-server shares the 2 cores with the scheduler, the triggerer,
the training job and the other test worker, so a 5 s default read timeout is not enough."""


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    home = tmp_path / "airflow_home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DRESSAGE_JOB"))}
    env |= {"DRESSAGE_AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(port)}
    log = (tmp_path / "standalone.log").open("w")
    proc = subprocess.Popen(
        ["bash", "scripts/airflow.sh"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "standalone.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Airflow did not become healthy"
            try:
                health = httpx.get(f"{base}/api/v2/monitor/health", timeout=5).json()
                if all(
                    health.get(part, {}).get("status") == "healthy"
                    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                ):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(2)
        secret = home / "simple_auth_manager_passwords.json.generated"
        password = json.loads(secret.read_text())["admin"]
        token = _api.post(
            f"{base}/auth/token", json={"username": "admin", "password": password}
        ).json()["access_token"]
        yield base, {"Authorization": f"Bearer {token}"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the script stops Airflow's process group
        proc.wait(60)
        log.close()


def _wait_run(base: str, headers: dict[str, str], dag_id: str, run_id: str) -> str:
    url = f"{base}/api/v2/dags/{dag_id}/dagRuns/{run_id}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = str(_api.get(url, headers=headers).json()["state"])
        if state in ("success", "failed"):
            return state
        time.sleep(2)
    raise AssertionError(f"{dag_id} {run_id} did not finish")


def _trigger(base: str, headers: dict[str, str], dag_id: str, conf: dict) -> httpx.Response:
    _api.patch(f"{base}/api/v2/dags/{dag_id}", headers=headers, json={"is_paused": False})
    body = {"logical_date": None, "conf": conf}
    return _api.post(f"{base}/api/v2/dags/{dag_id}/dagRuns", headers=headers, json=body)


def test_make_airflow_serves_the_dags_and_runs_them_from_a_trigger(
    standalone: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    base, headers = standalone
    port = int(base.rsplit(":", 1)[1])
    assert _api.get(f"{base}/api/v2/dags").status_code == 401  # signed-in users only
    with socket.socket() as sock:  # bound to loopback, not to the machine's other addresses
        other = socket.gethostbyname(socket.gethostname())
        assert other.startswith("127.") or sock.connect_ex((other, port)) != 0
    deadline = time.monotonic() + 120
    while True:  # the dag-processor parses the files shortly after start
        dags = _api.get(f"{base}/api/v2/dags", headers=headers).json()["dags"]
        if sorted(d["dag_id"] for d in dags) == DAG_IDS or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert sorted(d["dag_id"] for d in dags) == DAG_IDS
    assert _api.get(f"{base}/api/v2/importErrors", headers=headers).json()["total_entries"] == 0

    bad = _trigger(base, headers, "dressage_validate", {"objective": "nope"})
    assert bad.status_code == 400 and "objective" in bad.text  # refused at trigger time

    run = _trigger(base, headers, "dressage_validate", {})
    assert run.status_code == 200, run.text
    assert _wait_run(base, headers, "dressage_validate", run.json()["dag_run_id"]) == "success"

    conf = {
        "steps": 1,
        "rollout_batch_size": 2,
        "run_root": str(tmp_path / "runs"),
        "artifact_root": (tmp_path / "artifacts").as_uri(),
        "extra": {"max_response_len": 16, "agent_max_turns": 1},
    }
    run = _trigger(base, headers, "dressage_mopd", conf)
    assert run.status_code == 200, run.text
    run_id = run.json()["dag_run_id"]
    state = _wait_run(base, headers, "dressage_mopd", run_id)
    tis = _api.get(
        f"{base}/api/v2/dags/dressage_mopd/dagRuns/{run_id}/taskInstances", headers=headers
    ).json()["task_instances"]
    states = {t["task_id"]: t["state"] for t in tis}
    assert state == "success", states
    assert set(states.values()) == {"success"} and "train" in states
    staged = list((tmp_path / "artifacts" / "dressage_mopd").glob("*/rollout-00000/_MANIFEST.json"))
    assert staged, "the run staged its artifacts, manifest last"
