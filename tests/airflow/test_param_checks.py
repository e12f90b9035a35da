"""The checks the trigger form cannot make: one sentence per bad value, naming the field (its
title and key), the value, and what to enter instead."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.airflow.param_checks import (
    TRAINING_NUMBERS,
    training_problems,
    validation_problems,
)

pytestmark = pytest.mark.unit

GOOD: dict[str, Any] = {
    "steps": 4,
    "seed": 0,
    "rollout_batch_size": 4,
    "learning_rate": None,
    "job_timeout_minutes": 120,
    "poll_seconds": 5.0,
    "artifact_root": "runs/artifacts",
    "backend": "embedded",
    "ray_address": None,
    "ray_python": None,
}


def _one(**changes: Any) -> str:
    (problem,) = training_problems({**GOOD, **changes})
    assert problem.count(". ") == 0 and problem.endswith((".", ")")), problem  # one sentence
    return problem


def test_good_values_and_whole_floats_pass() -> None:
    assert training_problems(GOOD) == []
    assert training_problems({**GOOD, "steps": 4.0, "artifact_root": "s3://bucket/x"}) == []
    assert validation_problems({"teacher_skill_floor": 0.9}) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"steps": 0}, "Training steps (steps) is 0: enter a whole number from 1 to 1,000,000."),
        ({"steps": -3}, "Training steps (steps) is -3: enter a whole number from 1 to 1,000,000."),
        ({"steps": 2.5}, "Training steps (steps) is 2.5: enter a whole number from 1 to"),
        ({"seed": -1}, "Seed (seed) is -1: enter a whole number, 0 or more."),
        ({"learning_rate": 0}, "Learning rate (learning_rate) is 0: enter a number above 0."),
        ({"poll_seconds": 0.01}, "Status poll interval (s) (poll_seconds) is 0.01: enter a"),
        (
            {"artifact_root": "http://host/x"},
            "Artifact root (artifact_root) is 'http://host/x': enter a folder or a file://, "
            "s3://, gs:// URL",
        ),
        ({"artifact_root": "ftp://host/x"}, "Artifact root (artifact_root) is 'ftp://host/x'"),
        (
            {"backend": "ray", "ray_address": "127.0.0.1:8265", "ray_python": "python3"},
            "Ray dashboard address (ray_address) is '127.0.0.1:8265': the ray backend needs",
        ),
        (
            {"backend": "ray", "ray_address": "http://head:8265", "ray_python": ""},
            "Python on the cluster (ray_python) is empty",
        ),
    ],
)
def test_each_bad_value_is_one_sentence_naming_the_field_and_the_fix(
    changes: dict[str, Any], expected: str
) -> None:
    assert _one(**changes).startswith(expected)


def test_the_ray_fields_are_not_read_on_the_embedded_backend() -> None:
    assert training_problems({**GOOD, "ray_address": "nonsense", "ray_python": ""}) == []


def test_every_bad_value_is_reported_not_only_the_first() -> None:
    found = training_problems({**GOOD, "steps": 0, "seed": -1, "artifact_root": "http://x"})
    assert [p.split(" is ")[0] for p in found] == [
        "Training steps (steps)",
        "Seed (seed)",
        "Artifact root (artifact_root)",
    ]


def test_booleans_are_not_numbers_and_the_floor_is_a_share() -> None:
    assert training_problems({**GOOD, "steps": True})
    (floor,) = validation_problems({"teacher_skill_floor": 1.5})
    assert floor == "Teacher skill floor (teacher_skill_floor) is 1.5: enter a number from 0 to 1."


def test_the_form_states_each_range_the_plan_checks() -> None:
    assert TRAINING_NUMBERS["steps"].describe() == "A whole number from 1 to 1,000,000."
    assert TRAINING_NUMBERS["learning_rate"].describe() == "A number above 0."


def test_job_settings_the_job_would_refuse_are_one_sentence_each(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dressage.airflow.plan import RunPlan
    from dressage.airflow.tasks import job_settings_problems

    monkeypatch.delenv("DRESSAGE_JOB_MODULE", raising=False)

    def plan(objective: str, **extra: Any) -> RunPlan:
        params = {**GOOD, "mopd_config": "configs/mopd/embedded.json", "student": None}
        params |= {"run_root": str(tmp_path), "extra": extra}
        return RunPlan.from_params(
            params, dag_id="d", run_id="r", objective=objective, project_dir=tmp_path
        )

    assert job_settings_problems(plan("grpo", num_steps_per_rollout=4)) == []
    assert job_settings_problems(plan("grpo", learning_rat=1e-4)) == [
        "More job settings (extra): learning_rat is not a known key (did you mean 'learning_rate'?)"
    ]
    (refused,) = job_settings_problems(plan("mopd", kl_loss_coef=0.1))
    assert refused.startswith("More job settings (extra): kl_loss_coef 0.1 is GRPO-only")
    (refused,) = job_settings_problems(plan("mopd", mopd_objective="dense", mopd_topk=8))
    assert "mopd_topk 8 needs mopd_objective 'topk' (got 'dense')" in refused
    # another job module reads advanced its own way
    monkeypatch.setenv("DRESSAGE_JOB_MODULE", "tests.airflow.contract_job")
    assert job_settings_problems(plan("grpo", contract_job={"fail_at_step": 1})) == []


def test_the_mopd_objective_on_the_ray_backend_is_checked_when_the_run_is_planned(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dressage.airflow.plan import RunPlan
    from dressage.airflow.tasks import job_settings_problems

    monkeypatch.delenv("DRESSAGE_JOB_MODULE", raising=False)

    def problems(**extra: Any) -> list[str]:
        params = {**GOOD, "mopd_config": "configs/mopd/embedded.json", "student": None}
        params |= {"run_root": str(tmp_path), "extra": extra, "backend": "ray"}
        params |= {"ray_address": "http://head:8265"}
        plan = RunPlan.from_params(
            params, dag_id="d", run_id="r", objective="mopd", project_dir=tmp_path
        )
        return job_settings_problems(plan)

    assert problems(mopd_objective="topk", mopd_topk=32, mopd_forward_kl_weight=0.5) == []
    (dense,) = problems(mopd_objective="dense")
    assert dense.startswith("More job settings (extra): --mopd-objective dense is embedded-only")
    assert "about 8 GB a sample of 8k tokens" in dense and "use --mopd-objective topk" in dense
    cluster = {"extra_args": ["--allgather-cp", "--rollout-top-p", "0.9"]}
    assert problems(mopd_objective="topk", cluster=cluster) == [
        "More job settings (extra): --mopd-objective topk cannot run with --allgather-cp: its "
        "teacher support and loss follow slime's zigzag context-parallel layout, which "
        "--allgather-cp replaces with another; drop --allgather-cp or use --mopd-objective "
        "sampled",
        "More job settings (extra): --mopd-objective topk cannot run with --rollout-top-p 0.9 "
        "(below 1): slime's top-p replay masks the log-probs outside the rollout's nucleus, the "
        "log-probs the teacher's top-K support and tail are built from; use --rollout-top-p 1 "
        "or --mopd-objective sampled",
    ]
