"""Airflow tests: a temporary AIRFLOW_HOME (set here, before airflow loads) and its DB."""

from __future__ import annotations

import pytest

from tests.airflow import harness

harness.configure()

airflow_db = harness.airflow_db


@pytest.fixture
def contract_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training DAGs run tests/airflow/contract_job.py instead of dressage.jobs.train."""
    monkeypatch.setenv("DRESSAGE_JOB_MODULE", "tests.airflow.contract_job")
    monkeypatch.setenv("PYTHONPATH", str(harness.REPO))
