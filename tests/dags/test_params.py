"""Trigger-form Params: the defaults validate; a conf of the wrong type is refused when the run
is created, naming the Param; the schema is written for what Airflow's form does with it (no
range that the form would clamp silently, plain-text descriptions, optional fields typed null,
a section name of its own)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from dressage.airflow.params import SECTION
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
        ({"steps": "ten"}, "steps"),
        ({"backend": "kubernetes"}, "backend"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"extra": ["not", "an", "object"]}, "extra"),
    ],
)
def test_bad_conf_is_refused_at_trigger_time(
    airflow_db: None, conf: dict[str, Any], param: str
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"param {param}"):
        harness.run_dag("dressage_mopd", conf)


def test_advanced_knobs_sit_in_a_collapsed_section_of_their_own_name() -> None:
    params = harness.dagbag().dags["dressage_mopd"].params
    advanced = {k for k in params if params.get_param(k).schema.get("section") == SECTION}
    assert {"rollout_batch_size", "ray_address", "job_timeout_minutes", "extra"} <= advanced
    assert not {"mopd_config", "student", "artifact_root", "steps", "seed", "backend"} & advanced
    assert "advanced" not in SECTION.lower()  # not to be taken for Airflow's "Advanced Options"
    backend = params.get_param("backend").schema
    assert backend["enum"] == ["embedded", "ray"] and set(backend["values_display"]) == {
        "embedded",
        "ray",
    }


def _schemas(dag_id: str) -> dict[str, tuple[dict[str, Any], str | None]]:
    params = harness.dagbag().dags[dag_id].params
    return {k: (params.get_param(k).schema, params.get_param(k).description) for k in params}


@pytest.mark.parametrize("dag_id", ["dressage_mopd", "dressage_rl", "dressage_validate"])
def test_no_field_carries_what_the_form_would_apply_silently(dag_id: str) -> None:
    # The form clamps a number to minimum/maximum on blur, and only the API server checks a
    # pattern (its refusal is a JSON-Schema dump): ranges and patterns are the plan's checks.
    for name, (schema, _) in _schemas(dag_id).items():
        clamped = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern"}
        assert not clamped & set(schema), (name, schema)


@pytest.mark.parametrize("dag_id", ["dressage_mopd", "dressage_rl", "dressage_validate"])
def test_every_field_has_a_plain_text_description(dag_id: str) -> None:
    for name, (schema, description) in _schemas(dag_id).items():
        assert description and "`" not in description, (name, description)
        assert "description" not in schema  # the form shows Param.description, not this
        if "number" in schema["type"]:
            assert re.search(r"A (whole )?number( from| above|, )", description), description


def test_steps_and_seed_state_their_range() -> None:
    schemas = _schemas("dressage_mopd")
    assert schemas["steps"][1].endswith("A whole number from 1 to 1,000,000.")
    assert schemas["seed"][1].endswith("A whole number, 0 or more.")


def test_optional_fields_are_not_marked_required() -> None:
    # The form marks a field required unless its type list holds "null".
    schemas = _schemas("dressage_mopd")
    optional = {"student", "learning_rate", "partial_rollout", "extra", "ray_address", "ray_python",
                "continue_from"}  # fmt: skip
    for name, (schema, _) in schemas.items():
        typed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert ("null" in typed) == (name in optional), (name, typed)
