"""Airflow 3's REST API (v2) as the UI's trigger form drives it, for tests and scripts/chaos.py.

    api = AirflowApi("http://127.0.0.1:8080")
    api.wait_healthy(240, alive=lambda: proc.poll() is None)   # every component heartbeats
    api.sign_in(home / "simple_auth_manager_passwords.json.generated")     # the admin's token
    run = api.trigger("dressage_mopd", {"steps": 1})             # unpauses the DAG first
    api.wait_run("dressage_mopd", run.json()["dag_run_id"])      # "success" or "failed"
    api.task_instances("dressage_mopd", run_id)                  # {"train": {...}, ...}

Every call shares one client with a 60 s read timeout: the API server shares a small machine with
the scheduler, the triggerer and the training job, so httpx's 5 s default is not enough.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

__all__ = ["COMPONENTS", "AirflowApi"]

COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
"""The parts of ``/api/v2/monitor/health`` that must all be healthy."""


class AirflowApi:
    def __init__(self, base: str, *, timeout_s: float = 60.0) -> None:
        self.base = base.rstrip("/")
        self.client = httpx.Client(timeout=timeout_s)
        self.headers: dict[str, str] = {}

    def health(self) -> dict[str, str | None]:
        """Each component's status (None where the API server does not answer or name it)."""
        try:
            body = self.client.get(f"{self.base}/api/v2/monitor/health", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return dict.fromkeys(COMPONENTS)
        return {part: (body.get(part) or {}).get("status") for part in COMPONENTS}

    def wait_healthy(
        self, timeout_s: float, *, alive: Callable[[], bool] = lambda: True, where: str = ""
    ) -> float:
        """Wait until every component is healthy; the seconds it took. ``alive`` false (a
        component exited) or the timeout raises, naming ``where`` (its log)."""
        started = time.monotonic()
        while any(status != "healthy" for status in self.health().values()):
            if not alive():
                raise RuntimeError(f"an Airflow component exited before it was healthy: {where}")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"Airflow was not healthy within {timeout_s:.0f} s: {where}")
            time.sleep(2)
        return time.monotonic() - started

    def sign_in(self, password_file: Path, user: str = "admin") -> None:
        """A token for ``user`` with the password the simple auth manager generated."""
        password = json.loads(password_file.read_text())[user]
        answer = self.client.post(
            f"{self.base}/auth/token", json={"username": user, "password": password}
        )
        answer.raise_for_status()
        self.headers = {"Authorization": f"Bearer {answer.json()['access_token']}"}

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """``GET /api/v2/<path>`` with the token (none before :meth:`sign_in`)."""
        return self.client.get(f"{self.base}/api/v2/{path}", headers=self.headers, **kwargs)

    def dag_ids(self) -> list[str]:
        return sorted(d["dag_id"] for d in self.get("dags").json()["dags"])

    def wait_dags(self, expected: list[str], timeout_s: float = 120.0) -> list[str]:
        """The DAG ids once they are ``expected`` (the dag-processor parses the files shortly
        after it starts), or those there are at the timeout."""
        deadline = time.monotonic() + timeout_s
        while (found := self.dag_ids()) != sorted(expected) and time.monotonic() < deadline:
            time.sleep(2)
        return found

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> httpx.Response:
        """Unpause ``dag_id`` and trigger a run with ``conf`` (the response, unchecked)."""
        url = f"{self.base}/api/v2/dags/{dag_id}"
        self.client.patch(url, headers=self.headers, json={"is_paused": False})
        body = {"logical_date": None, "conf": conf}
        return self.client.post(f"{url}/dagRuns", headers=self.headers, json=body)

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.get(f"dags/{dag_id}/dagRuns/{run_id}").json()["state"])

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float = 300.0) -> str:
        """The run's end state, "success" or "failed"; the timeout raises."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise TimeoutError(f"{dag_id} {run_id} did not finish within {timeout_s:.0f} s")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's task instances by task id (unmapped tasks: one each)."""
        found = self.get(f"dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
        return {ti["task_id"]: ti for ti in found["task_instances"]}
