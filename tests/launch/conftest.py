"""Launcher tests reach Airflow (the trigger, one DAG on the Ray backend): give it the temporary
AIRFLOW_HOME of tests/airflow before anything imports airflow."""

from __future__ import annotations

from tests.airflow import harness

harness.configure()

airflow_db = harness.airflow_db
