"""Part 8: Airflow's scheduler and triggerer killed with ``kill -9`` while ``train`` is deferred.

Airflow runs as ``make airflow`` runs it (the environment of ``scripts/airflow.sh``: SQLite in
an ``AIRFLOW_HOME`` under the workdir, the project's DAGs and plugins, LocalExecutor with
parallelism 2, the API on loopback, the simple auth manager), but as four processes, each in its
own session: ``airflow api-server``, ``scheduler``, ``dag-processor`` and ``triggerer``. A
``dressage_mopd`` run is triggered through the REST API (:mod:`dressage.testing.airflow_api`) on
the embedded default; once ``train`` is deferred and its job has logged a training step, the
scheduler's and the triggerer's process groups get SIGKILL together, and after a few seconds a
new scheduler and a new triggerer start. Checked, as the README says ("Restarting Airflow's
scheduler or triggerer during ``train`` needs nothing"):

- the training job (a local job in its own session, :mod:`dressage.launch.local`) is still
  running right after the kills, and is the same process when it ends (no second attempt);
- the run succeeds with ``train`` on its first try (``try_number`` 1: the new triggerer polled
  the same job to its end; a resubmission would be a retry);
- ``metrics.jsonl`` holds every step 0 to N-1 once.

Measured besides: the seconds from the restart until the new triggerer took the trigger over
(read from Airflow's SQLite database: the trigger's ``triggerer_id`` changes to the new
triggerer's job; it waits for the killed triggerer's heartbeat to grow older than
``[triggerer] triggerer_health_check_threshold``, 30 s by default).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from .services import BIN, REPO, Service, free_port

DAG_ID = "dressage_mopd"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
KILLED = ("scheduler", "triggerer")
START_TIMEOUT_S = 300.0
STEP_TIMEOUT_S = 900.0
RUN_TIMEOUT_S = 1800.0


def airflow_env(home: Path, port: int) -> dict[str, str]:
    """The environment ``scripts/airflow.sh`` gives Airflow, with a fresh JWT secret and Fernet
    key (kept for every component and every restart), and the checkout's dressage first."""
    from cryptography.fernet import Fernet

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DRESSAGE_JOB"))}
    env |= {
        "AIRFLOW_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_AUTH_MODE": "disabled",
    }
    return env


class Component(Service):
    """``airflow <name>`` in its own session, its output appended to ``<logs>/<name>.log``;
    launched, not waited for (Airflow's health endpoint says when it serves)."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        super().__init__(name, [str(BIN / "airflow"), name], env, logs / f"{name}.log", ready="")
        self.starts = 0

    def launch(self) -> Component:
        super().launch()
        self.starts += 1
        return self


def steps_check(logged: dict[str, list[int]], steps: int) -> dict[str, Any]:
    """What ``metrics.jsonl`` holds (:func:`dressage.testing.mopd_run.logged_steps`) against the
    run's ``steps``: every step 0 to steps-1 once."""
    return {
        "steps_logged": len(logged["steps"]),
        "duplicated_steps": logged["duplicated"],
        "missing_steps": [s for s in range(steps) if s not in logged["steps"]],
        "steps_complete": logged["steps"] == list(range(steps)) and not logged["duplicated"],
    }


def held(figures: dict[str, Any]) -> bool:
    """The README's claim: the run succeeded, ``train`` on its first try, the job survived the
    kills and ran to its end as the same process (not submitted again), and every step was
    logged once."""
    return (
        figures["run_state"] == "success"
        and figures["train_try_number"] == 1
        and figures["job_alive_after_kills"] is True
        and figures["job_attempts"] == 1
        and figures["job_same_process"] is True
        and figures["steps_complete"] is True
    )


def _trigger_owner(db: Path, run_id: str) -> int | None:
    """The triggerer job id that holds ``train``'s trigger (None: unassigned or no trigger)."""
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=10) as con:
        row = con.execute(
            "SELECT t.triggerer_id FROM task_instance ti JOIN trigger t ON t.id = ti.trigger_id "
            "WHERE ti.dag_id = ? AND ti.run_id = ? AND ti.task_id = 'train'",
            (DAG_ID, run_id),
        ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _job_record(jobs: Path, sid: str) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads((jobs / sid / "state.json").read_text())
    except FileNotFoundError:
        return None
    return record


def airflow_restart_round(
    workdir: Path, *, steps: int, save_interval: int, restart_after_s: float
) -> dict[str, Any]:
    """Run the round (the module docstring); its figures."""
    from dressage.launch.base import JobState, sanitize_id, submission_id
    from dressage.launch.local import LocalLauncher
    from dressage.testing.airflow_api import AirflowApi
    from dressage.testing.mopd_run import logged_steps

    started = time.monotonic()
    work = workdir / "airflow"
    home, logs, run_root = work / "airflow_home", work / "logs", work / "runs"
    for folder in (home, logs, run_root):
        folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = airflow_env(home, port)
    figures: dict[str, Any] = {"steps": steps, "save_interval": save_interval}
    subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"], env=env, cwd=REPO, check=True,
        stdout=(logs / "db-migrate.log").open("ab"), stderr=subprocess.STDOUT, timeout=600,
    )  # fmt: skip
    parts = {name: Component(name, env, logs) for name in COMPONENTS}
    jobs: Path | None = None
    try:
        for part in parts.values():
            part.launch()
        api = AirflowApi(f"http://127.0.0.1:{port}")
        everyone = lambda: all(p.alive() for p in parts.values())  # noqa: E731
        figures["airflow_start_s"] = round(
            api.wait_healthy(START_TIMEOUT_S, alive=everyone, where=str(logs)), 1
        )
        api.sign_in(home / "simple_auth_manager_passwords.json.generated")
        if DAG_ID not in api.wait_dags([DAG_ID, "dressage_rl", "dressage_validate"]):
            raise RuntimeError(f"{DAG_ID} was not parsed: see {logs / 'dag-processor.log'}")
        conf = {
            "steps": steps,
            "rollout_batch_size": 2,
            "run_root": str(run_root),
            "artifact_root": (work / "artifacts").as_uri(),
            "extra": {"max_response_len": 16, "agent_max_turns": 1, "save_interval": save_interval},
        }
        answer = api.trigger(DAG_ID, conf)
        if answer.status_code != 200:
            raise RuntimeError(f"triggering {DAG_ID} answered {answer.status_code}: {answer.text}")
        run_id = str(answer.json()["dag_run_id"])
        triggered = time.monotonic()
        jobs = run_root / DAG_ID / sanitize_id(run_id) / "jobs"
        metrics = jobs.parent / "output" / "metrics.jsonl"
        sid = submission_id(DAG_ID, run_id, "train")
        launcher = LocalLauncher(jobs)
        print(f"part 8: {DAG_ID} run {run_id} triggered; waiting for train to defer and step")

        def stepped() -> int:
            return len(logged_steps(metrics)["steps"]) if metrics.is_file() else 0

        while True:  # train deferred, its job past its first step
            state = api.task_instances(DAG_ID, run_id).get("train", {}).get("state")
            if state == "deferred" and stepped() >= 1:
                break
            if api.run_state(DAG_ID, run_id) in ("success", "failed"):
                raise RuntimeError(f"the run ended before train was deferred: see {jobs}")
            if time.monotonic() - triggered > STEP_TIMEOUT_S:
                raise TimeoutError(f"train did not defer and step within {STEP_TIMEOUT_S:.0f} s")
            time.sleep(1)
        figures["first_step_after_trigger_s"] = round(time.monotonic() - triggered, 1)
        record = _job_record(jobs, sid)
        assert record is not None, f"no state.json of job {sid}"
        figures["owner_before_kills"] = _trigger_owner(home / "airflow.db", run_id)
        for name in KILLED:
            parts[name].kill9()
        figures["steps_at_kills"] = stepped()
        status = launcher.status(sid)
        figures["job_alive_after_kills"] = status is not None and status.state is JobState.RUNNING
        print(f"part 8: scheduler and triggerer killed at step {figures['steps_at_kills']}")
        time.sleep(restart_after_s)
        status = launcher.status(sid)
        figures["job_alive_at_restart"] = status is not None and status.state is JobState.RUNNING
        restarted = time.monotonic()
        for name in KILLED:
            parts[name].launch()
        pickup: float | None = None
        while (state := api.run_state(DAG_ID, run_id)) not in ("success", "failed"):
            owner = _trigger_owner(home / "airflow.db", run_id)
            if pickup is None and owner is not None and owner != figures["owner_before_kills"]:
                pickup = time.monotonic() - restarted
                print(f"part 8: the new triggerer took the trigger over after {pickup:.1f} s")
            if time.monotonic() - restarted > RUN_TIMEOUT_S:
                raise TimeoutError(f"the run did not end within {RUN_TIMEOUT_S:.0f} s")
            time.sleep(1)
        figures["restart_to_end_s"] = round(time.monotonic() - restarted, 1)
        figures["trigger_pickup_s"] = None if pickup is None else round(pickup, 1)
        tis = api.task_instances(DAG_ID, run_id)
        figures["run_state"] = state
        figures["task_states"] = {task: ti["state"] for task, ti in sorted(tis.items())}
        figures["train_try_number"] = tis.get("train", {}).get("try_number")
        after = _job_record(jobs, sid) or {}
        final = launcher.status(sid)
        figures["job_state"] = final.state.value if final else None
        figures["job_same_process"] = (after.get("pid"), after.get("start_ticks")) == (
            record["pid"],
            record["start_ticks"],
        )
        figures["job_attempts"] = 1 + len(list(jobs.glob(f"{sid}.attempt-*")))  # archived
        figures |= steps_check(logged_steps(metrics), steps)
        figures["restarts"] = {name: parts[name].starts - 1 for name in KILLED}
    finally:
        for part in parts.values():
            if part.alive():
                part.kill9()
        if jobs is not None and jobs.is_dir():  # a run that did not end: its jobs go too
            stopper = LocalLauncher(jobs, stop_grace_s=5.0)
            for state_file in jobs.glob("*/state.json"):
                stopper.stop(state_file.parent.name)
        figures["seconds"] = round(time.monotonic() - started, 1)
    return figures
