"""DAG integrity tests: the temporary AIRFLOW_HOME of tests/airflow, set before import."""

from __future__ import annotations

from tests.airflow import harness

harness.configure()

airflow_db = harness.airflow_db
