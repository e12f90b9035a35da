"""Airflow's plugins folder for `make airflow` (scripts/airflow.sh points Airflow here).

The plugin itself, the run notes and the curves route, is :mod:`dressage.airflow.plugin`.
"""

from __future__ import annotations

from dressage.airflow.plugin import DressagePlugin

__all__ = ["DressagePlugin"]
