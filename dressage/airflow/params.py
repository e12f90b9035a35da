"""The trigger forms: Params of the training and validation DAGs, as Airflow's form shows them.

What the form (Airflow 3.3) does with a Param's JSON Schema decides how it is written here:

- ``type`` picks the widget; a type list with ``"null"`` marks the field optional, any other
  type marks it required (an asterisk; the form refuses to trigger while it is empty).
- ``description`` is shown as plain text (no markdown here: backticks would show as such);
  ``description_md`` would be rendered as markdown.
- A number field clamps to ``minimum``/``maximum`` without a word when it loses focus, and a
  ``pattern`` is checked only by the API server, whose refusal is a raw JSON-Schema dump. So
  number fields carry no range and strings no pattern: the range is said in the description,
  and the run's first task checks it (:mod:`dressage.airflow.param_checks`), failing at once
  with one sentence that names the field and what to enter.
- ``section`` groups fields in a collapsed panel; ours is :data:`SECTION`, named so that it is
  not taken for Airflow's own "Advanced Options" (run id, logical date, raw conf).

Relative paths are relative to the project folder (the parent of ``dags/``).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from dressage.airflow.param_checks import TRAINING_NUMBERS, VALIDATION_NUMBERS, NumberRule
from dressage.config.env import env_str

__all__ = [
    "DEFAULT_CONFIG",
    "SECTION",
    "schedule_from_env",
    "training_params",
    "validation_params",
]

SCHEDULE_ENV = "DRESSAGE_MOPD_SCHEDULE"  # declared in dressage.config.env

DEFAULT_CONFIG = "configs/mopd/embedded.json"
SECTION = "Job and cluster settings"


def _number(
    default: float | None,
    rule: NumberRule,
    description: str,
    *,
    optional: bool = False,
    section: str | None = None,
) -> Param:
    """A number field without ``minimum``/``maximum`` (see the module docstring)."""
    extra: dict[str, Any] = {"section": section} if section else {}
    return Param(
        default,
        type=["null", "number"] if optional else "number",
        title=rule.title,
        description=f"{description} {rule.describe()}",
        **extra,
    )


def _config(title: str, description: str) -> Param:
    return Param(
        DEFAULT_CONFIG,
        type="string",
        minLength=1,
        title=title,
        description=description,
        examples=[DEFAULT_CONFIG, "configs/mopd/mopd_alfworld_hotpotqa.example.json"],
    )


def _student() -> Param:
    return Param(
        None,
        type=["null", "string"],
        title="Student checkpoint",
        description="A Hugging Face checkpoint folder, or tiny:seed=N for a small generated "
        "model. Leave empty to use the config's student.",
    )


def _run_root(section: str | None) -> Param:
    extra: dict[str, Any] = {"section": section} if section else {}
    return Param(
        "runs",
        type="string",
        minLength=1,
        title="Run folder",
        description="Where run files go (run.json, job logs, job output, proxy store). On the "
        "ray backend the cluster must see this path too (a shared mount).",
        **extra,
    )


def training_params(*, objective: str) -> dict[str, Param]:
    """Params of ``dressage_mopd`` (objective "mopd") and ``dressage_rl`` (objective "grpo")."""
    rl = objective == "grpo"
    n = TRAINING_NUMBERS
    params: dict[str, Any] = {
        "mopd_config": _config(
            "Config" if rl else "MOPD config",
            "Datasets and reward modules (its teachers are not used by GRPO)."
            if rl
            else "Teachers, datasets (each naming its teacher) and reward modules.",
        ),
        "student": _student(),
        "artifact_root": Param(
            "runs/artifacts",
            type="string",
            minLength=1,
            title="Artifact root",
            description="A folder, or a file://, s3:// or gs:// URL. Each run is staged to "
            "root/dag id/run id/.",
        ),
        "continue_from": Param(
            None,
            type=["null", "string"],
            title="Continue from",
            description="fresh: the config's student, from the first prompt. latest: the "
            "student the last successful run of this DAG published, with its data position "
            "(fresh when there is none). Or a checkpoint: a run's output/checkpoints folder, one "
            "iter_XXXXXXX folder in it, or a file:// URL. Empty: latest for scheduled runs, "
            "fresh otherwise. On the ray backend a slime run's checkpoint: its weights and "
            "data position, a fresh optimizer.",
            examples=["fresh", "latest", "runs/dressage_mopd/RUN/output/checkpoints"],
        ),
        "steps": _number(4, n["steps"], "Optimizer steps of the run, one rollout batch each."),
        "seed": _number(0, n["seed"], "Seeds sampling and data order: same seed, same run."),
        "backend": Param(
            "embedded",
            type="string",
            enum=["embedded", "ray"],
            values_display={
                "embedded": "embedded (this machine: local processes, embedded engine)",
                "ray": "ray (a Ray cluster through the Jobs API)",
            },
            title="Backend",
            description="Where the engine, the proxy and the training job run.",
        ),
        "rollout_batch_size": _number(
            4, n["rollout_batch_size"], "Trajectories per training step.", section=SECTION
        ),
        "partial_rollout": Param(
            True,
            type=["null", "boolean"],
            title="Partial rollout",
            description="Pause generation at a token boundary around weight updates and "
            "record each token's weight version.",
            section=SECTION,
        ),
        "learning_rate": _number(
            None,
            n["learning_rate"],
            "Leave empty to keep the job's default.",
            optional=True,
            section=SECTION,
        ),
        "extra": Param(
            {},
            type=["null", "object"],
            title="More job settings",
            description="A JSON object passed to the job untouched (the advanced object of "
            "its run.json), e.g. max_response_len; for MOPD mopd_objective (topk by default, "
            "with mopd_topk 16; dense on the embedded backend; sampled) and "
            "mopd_forward_kl_weight; save_interval (steps between checkpoints, 10); or cluster "
            "settings for the ray backend.",
            section=SECTION,
        ),
        "run_root": _run_root(SECTION),
        "ray_address": Param(
            "http://127.0.0.1:8265",
            type=["null", "string"],
            title="Ray dashboard address",
            description="The ray backend only: the cluster's dashboard URL (http://...:8265).",
            section=SECTION,
        ),
        "ray_python": Param(
            "python3",
            type=["null", "string"],
            title="Python on the cluster",
            description="The ray backend only: the interpreter of the job's entrypoint.",
            section=SECTION,
        ),
        "job_timeout_minutes": _number(
            120, n["job_timeout_minutes"], "The job is stopped after this.", section=SECTION
        ),
        "poll_seconds": _number(
            5.0, n["poll_seconds"], "How often the job's state is read.", section=SECTION
        ),
    }
    return params


def validation_params() -> dict[str, Param]:
    """Params of ``dressage_validate``."""
    return {
        "mopd_config": _config("MOPD config", "The config to check."),
        "student": _student(),
        "objective": Param(
            "mopd",
            type="string",
            enum=["mopd", "grpo"],
            title="Objective",
            description="mopd also compares every teacher with the student.",
        ),
        "teacher_skill_floor": _number(
            0.9,
            VALIDATION_NUMBERS["teacher_skill_floor"],
            "Least held-out accuracy on its own task that a project-built teacher's report "
            "may show (measured through the agent loop when it was built).",
        ),
        "require_skilled_teachers": Param(
            False,
            type=["null", "boolean"],
            title="Require skilled teachers",
            description="A teacher below the floor fails the run (otherwise: a warning).",
        ),
        "run_root": _run_root(None),
    }


def schedule_from_env(name: str = SCHEDULE_ENV) -> str | None:
    """A DAG schedule from a declared ``DRESSAGE_*`` variable; None (manual only) when unset."""
    value = env_str(name)
    return (value.strip() or None) if value is not None else None
