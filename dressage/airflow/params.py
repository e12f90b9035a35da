"""The trigger forms: Params of the training and validation DAGs, checked by JSON Schema.

Airflow validates a run's conf against these at trigger time, so a bad value (a negative step
count, an unknown backend, an artifact root that is neither a path nor a URL) is refused before
any task runs. Knobs most runs leave alone sit in the collapsed "Advanced" section. Relative
paths are relative to the project folder (the parent of ``dags/``).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from dressage.config.env import declare, env_str

__all__ = ["DEFAULT_CONFIG", "schedule_from_env", "training_params", "validation_params"]

SCHEDULE_ENV = "DRESSAGE_MOPD_SCHEDULE"
declare(
    SCHEDULE_ENV,
    None,
    "Schedule of the dressage_mopd DAG: a cron expression or preset (@daily, ...); "
    "unset = triggered runs only. Read by the DAG processor when it parses the DAG.",
)

DEFAULT_CONFIG = "configs/mopd/embedded.json"
ADVANCED = "Advanced"
_ROOT_PATTERN = r"^((file|s3|gs|gcs|memory)://.+|[^:]+)$"


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
        description="An HF folder or `tiny:seed=N`; empty takes the config's `student`.",
    )


def _run_root() -> Param:
    return Param(
        "runs",
        type="string",
        minLength=1,
        title="Run folder",
        description="Where run files go (run.json, job logs, job output, proxy store). On the "
        "ray backend the cluster must see this path too (a shared mount).",
        section=ADVANCED,
    )


def training_params(*, objective: str) -> dict[str, Param]:
    """Params of ``dressage_mopd`` (objective "mopd") and ``dressage_rl`` (objective "grpo")."""
    rl = objective == "grpo"
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
            pattern=_ROOT_PATTERN,
            title="Artifact root",
            description="Staged artifacts go to `<root>/<dag_id>/<run_id>/`: a folder, "
            "`file://`, `s3://` or `gs://` URL.",
        ),
        "steps": Param(4, type="integer", minimum=1, maximum=1_000_000, title="Training steps"),
        "seed": Param(0, type="integer", minimum=0, title="Seed"),
        "backend": Param(
            "embedded",
            type="string",
            enum=["embedded", "ray"],
            values_display={
                "embedded": "embedded (this machine: local processes, embedded engine)",
                "ray": "ray (a Ray cluster through the Jobs API)",
            },
            title="Backend",
        ),
        "rollout_batch_size": Param(
            4, type="integer", minimum=1, title="Rollout batch size", section=ADVANCED
        ),
        "partial_rollout": Param(
            True,
            type="boolean",
            title="Partial rollout",
            description="Pause generation at a token boundary around weight updates and "
            "record each token's weight version.",
            section=ADVANCED,
        ),
        "learning_rate": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            title="Learning rate",
            description="Empty keeps the job's default.",
            section=ADVANCED,
        ),
        "extra": Param(
            {},
            type="object",
            title="More job settings",
            description="Passed to the job untouched, in RUN.json's `advanced` object.",
            section=ADVANCED,
        ),
        "run_root": _run_root(),
        "ray_address": Param(
            "http://127.0.0.1:8265",
            type="string",
            pattern=r"^https?://.+",
            title="Ray dashboard address",
            section=ADVANCED,
        ),
        "ray_python": Param(
            "python3",
            type="string",
            minLength=1,
            title="Python on the cluster",
            description="Interpreter of the job's entrypoint on the ray backend.",
            section=ADVANCED,
        ),
        "job_timeout_minutes": Param(
            120, type="integer", minimum=1, title="Job timeout (minutes)", section=ADVANCED
        ),
        "poll_seconds": Param(
            5.0, type="number", minimum=0.2, title="Status poll interval (s)", section=ADVANCED
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
        "teacher_skill_floor": Param(
            0.9,
            type="number",
            minimum=0,
            maximum=1,
            title="Teacher skill floor",
            description=(
                "Least held-out accuracy on its own task that a project-built teacher's report "
                "may show (measured through the agent loop when it was built)."
            ),
        ),
        "require_skilled_teachers": Param(
            False,
            type="boolean",
            title="Require skilled teachers",
            description="A teacher below the floor fails the run (otherwise: a warning).",
        ),
        "run_root": _run_root(),
    }


def schedule_from_env(name: str = SCHEDULE_ENV) -> str | None:
    """A DAG schedule from a declared ``DRESSAGE_*`` variable; None (manual only) when unset."""
    value = (env_str(name) or "").strip()
    return value or None
