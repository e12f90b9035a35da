"""`make airflow` (scripts/airflow.sh): Airflow standalone on loopback with the dressage DAGs,
driven through its public REST API as the UI's trigger form drives it: sign in with the generated
admin password, list the DAGs, reject a trigger whose Params break the schema, run
dressage_validate, and run a one-step dressage_mopd with the real training job under the real
scheduler, LocalExecutor and triggerer (the deferred training task)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dressage.testing.airflow_api import AirflowApi
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.integration

DAG_IDS = ["dressage_mopd", "dressage_rl", "dressage_validate"]


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[AirflowApi]:
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
    api = AirflowApi(f"http://127.0.0.1:{port}")  # 60 s reads: the 2 cores are busy
    try:
        alive = lambda: proc.poll() is None  # noqa: E731
        try:
            api.wait_healthy(240, alive=alive, where="standalone.log")
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError((tmp_path / "standalone.log").read_text()[-3000:]) from exc
        api.sign_in(home / "simple_auth_manager_passwords.json.generated")
        yield api
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the script stops Airflow's process group
        proc.wait(60)
        log.close()


def test_make_airflow_serves_the_dags_and_runs_them_from_a_trigger(
    standalone: AirflowApi, tmp_path: Path
) -> None:
    api = standalone
    port = int(api.base.rsplit(":", 1)[1])
    assert api.client.get(f"{api.base}/api/v2/dags").status_code == 401  # signed-in users only
    with socket.socket() as sock:  # bound to loopback, not to the machine's other addresses
        other = socket.gethostbyname(socket.gethostname())
        assert other.startswith("127.") or sock.connect_ex((other, port)) != 0
    assert api.wait_dags(DAG_IDS) == DAG_IDS  # the dag-processor parses them after its start
    assert api.get("importErrors").json()["total_entries"] == 0

    bad = api.trigger("dressage_validate", {"objective": "nope"})
    assert bad.status_code == 400 and "objective" in bad.text  # refused at trigger time

    run = api.trigger("dressage_validate", {})
    assert run.status_code == 200, run.text
    assert api.wait_run("dressage_validate", run.json()["dag_run_id"]) == "success"

    conf = {
        "steps": 1,
        "rollout_batch_size": 2,
        "run_root": str(tmp_path / "runs"),
        "artifact_root": (tmp_path / "artifacts").as_uri(),
        "extra": {"max_response_len": 16, "agent_max_turns": 1},
    }
    run = api.trigger("dressage_mopd", conf)
    assert run.status_code == 200, run.text
    run_id = run.json()["dag_run_id"]
    state = api.wait_run("dressage_mopd", run_id)
    states = {task: ti["state"] for task, ti in api.task_instances("dressage_mopd", run_id).items()}
    assert state == "success", states
    assert set(states.values()) == {"success"} and "train" in states
    staged = list((tmp_path / "artifacts" / "dressage_mopd").glob("*/rollout-00000/_MANIFEST.json"))
    assert staged, "the run staged its artifacts, manifest last"
