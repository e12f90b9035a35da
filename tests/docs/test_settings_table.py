"""docs/settings.md names every setting a run takes: each launcher flag, each trigger-form Param,
each RUN.json key and each launcher variable, so that a new setting cannot be left out of it."""

from __future__ import annotations

import re

import pytest

from dressage.config.job import ClusterOptions, JobOptions
from dressage.config.run import MopdRunConfig, MopdRunSettings, TrainRunConfig
from tests.helpers import REPO

pytestmark = pytest.mark.unit

TABLE = (REPO / "docs/settings.md").read_text()
# What the DAG or the launcher fills in itself, never a user.
NOT_SETTINGS = {"objective", "engine_url", "proxy_url", "advanced", "cluster"}


def _named(key: str) -> bool:
    """``key`` is in the table as a key of its own: `key`, `extra.key`, `advanced.key`, ..."""
    return re.search(rf"[`.]{re.escape(key)}\b", TABLE) is not None


def test_every_launcher_flag_and_variable_is_in_the_table() -> None:
    for name in MopdRunConfig.model_fields:
        if name == "extra_args":  # slime's own flags, after --
            assert "after `--`" in TABLE
        elif name not in NOT_SETTINGS:
            assert f"`--{name.replace('_', '-')}" in TABLE, name
    for variable in MopdRunSettings.ENV.values():
        assert f"`{variable}`" in TABLE, variable


def test_every_form_param_is_in_the_table() -> None:
    from dressage.airflow.params import training_params, validation_params

    names = set(training_params(objective="mopd")) | set(validation_params())
    for name in names - NOT_SETTINGS:
        assert f"`{name}`" in TABLE, name


def test_every_run_json_key_is_in_the_table() -> None:
    for name in TrainRunConfig.model_fields:
        if name not in NOT_SETTINGS:
            assert _named(name), name
    for name in set(JobOptions.model_fields) | set(ClusterOptions.model_fields):
        if name not in NOT_SETTINGS:
            assert _named(name), name
