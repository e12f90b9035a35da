"""Trigger-form Params: the defaults validate; a conf that breaks the JSON Schema is refused
when the run is created, with an error that names the Param."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.airflow import harness

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dag_id", ["dressage_mopd", "dressage_rl", "dressage_validate"])
def test_defaults_validate(dag_id: str) -> None:
    resolved = copy.deepcopy(harness.dagbag().dags[dag_id].params).validate()
    assert resolved["mopd_config"] == "configs/mopd/embedded.json"
    assert resolved["student"] is None


@pytest.mark.parametrize(
    ("conf", "param"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": "ten"}, "steps"),
        ({"backend": "kubernetes"}, "backend"),
        ({"artifact_root": "ftp://host/x"}, "artifact_root"),
        ({"ray_address": "127.0.0.1:8265"}, "ray_address"),
        ({"learning_rate": -0.1}, "learning_rate"),
        ({"extra": ["not", "an", "object"]}, "extra"),
    ],
)
def test_bad_conf_is_refused_at_trigger_time(
    airflow_db: None, conf: dict[str, Any], param: str
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"param {param}"):
        harness.run_dag("dressage_mopd", conf)


def test_advanced_knobs_sit_in_a_collapsed_section() -> None:
    params = harness.dagbag().dags["dressage_mopd"].params
    advanced = {k for k in params if params.get_param(k).schema.get("section") == "Advanced"}
    assert {"rollout_batch_size", "ray_address", "job_timeout_minutes", "extra"} <= advanced
    assert not {"mopd_config", "student", "artifact_root", "steps", "seed", "backend"} & advanced
    backend = params.get_param("backend").schema
    assert backend["enum"] == ["embedded", "ray"] and set(backend["values_display"]) == {
        "embedded",
        "ray",
    }
