"""Airflow tests: a temporary AIRFLOW_HOME (set here, before airflow loads) and its DB."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.airflow import harness

harness.configure()

airflow_db = harness.airflow_db


@pytest.fixture
def contract_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training DAGs run tests/airflow/contract_job.py instead of dressage.jobs.train."""
    monkeypatch.setenv("DRESSAGE_JOB_MODULE", "tests.airflow.contract_job")
    monkeypatch.setenv("PYTHONPATH", str(harness.REPO))


@pytest.fixture
def note_listener() -> Iterator[None]:
    """The plugin's run-note listener, as `make airflow` loads it (dag.test() loads no plugin)."""
    from airflow.listeners.listener import get_listener_manager

    from dressage.airflow.plugin import NoteListener

    manager = get_listener_manager()
    listener = NoteListener()
    manager.add_listener(listener)
    yield
    manager.pm.unregister(listener)
