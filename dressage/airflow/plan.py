"""The typed plan of one training DAG run, built once from its Params (no airflow import).

    plan = RunPlan.from_params(params, dag_id="dressage_mopd", run_id=run_id,
                               objective="mopd", project_dir=Path("/repo"))
    plan.run_dir, plan.output_dir, plan.artifact_url       # where everything goes

Relative paths in Params are relative to the project folder (the parent of ``dags/``); a plain
path as the artifact root becomes a ``file://`` URL. Folders of a run::

    <run_root>/<dag_id>/<run>/run.json         the job's run config (RUN.json)
                              jobs/<id>/       local jobs: job.log, state.json, exit.json
                              output/          the job's output_dir
                              secrets/         the proxy admin key (0600)
                              proxy-store/     the proxy's trajectory store
    <artifact_root>/<dag_id>/<run>/            the staged run (see dressage.staging.stage)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dressage.config.run import TrainRunConfig
from dressage.launch.base import sanitize_id

__all__ = ["RunPlan", "artifact_root_url", "resolve_path"]


def resolve_path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def artifact_root_url(value: str, base: Path) -> str:
    """A URL for the artifact root: URLs pass through, paths become ``file://`` URLs."""
    text = value.strip().rstrip("/")
    if "://" in text:
        return text
    return resolve_path(text, base).as_uri()


class RunPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dag_id: str
    run_id: str
    run_slug: str
    objective: Literal["mopd", "grpo"]
    backend: Literal["embedded", "ray"]
    mopd_config: str
    student: str | None
    artifact_url: str
    run_dir: str
    steps: int = Field(ge=1)
    seed: int = Field(ge=0)
    rollout_batch_size: int = Field(ge=1)
    partial_rollout: bool
    learning_rate: float | None = Field(default=None, gt=0)
    extra: dict[str, Any] = Field(default_factory=dict)
    ray_address: str
    ray_python: str
    job_timeout_s: float = Field(gt=0)
    poll_s: float = Field(gt=0)
    continue_from: str | None = None
    """The checkpoint folder the run starts from (None: fresh), resolved by the plan task from
    the ``continue_from`` Param (:func:`dressage.airflow.tasks.plan_run`)."""
    continue_mode: Literal["fresh", "latest", "checkpoint"] = "fresh"
    parent_run: str | None = None
    """The run that published :attr:`continue_from` (``latest``), when known."""

    @classmethod
    def from_params(
        cls,
        params: Mapping[str, Any],
        *,
        dag_id: str,
        run_id: str,
        objective: str,
        project_dir: Path,
    ) -> RunPlan:
        slug = sanitize_id(run_id)
        student = params.get("student") or None
        if student and not str(student).startswith("tiny:"):
            student = str(resolve_path(str(student), project_dir))
        run_root = resolve_path(str(params["run_root"]), project_dir)
        return cls(
            dag_id=dag_id,
            run_id=run_id,
            run_slug=slug,
            objective=objective,  # type: ignore[arg-type]
            backend=params["backend"],
            mopd_config=str(resolve_path(str(params["mopd_config"]), project_dir)),
            student=student,
            artifact_url=f"{artifact_root_url(str(params['artifact_root']), project_dir)}/"
            f"{dag_id}/{slug}",
            run_dir=str(run_root / dag_id / slug),
            steps=params["steps"],
            seed=params["seed"],
            rollout_batch_size=params["rollout_batch_size"],
            partial_rollout=params.get("partial_rollout") is not False,  # optional: on
            learning_rate=params.get("learning_rate"),
            extra=dict(params.get("extra") or {}),
            ray_address=str(params.get("ray_address") or ""),
            ray_python=str(params.get("ray_python") or ""),
            job_timeout_s=float(params["job_timeout_minutes"]) * 60.0,
            poll_s=float(params.get("poll_seconds", 5.0)),
        )

    @property
    def output_dir(self) -> Path:
        return Path(self.run_dir) / "output"

    @property
    def jobs_dir(self) -> Path:
        return Path(self.run_dir) / "jobs"

    @property
    def run_config_path(self) -> Path:
        return Path(self.run_dir) / "run.json"

    @property
    def admin_key_file(self) -> Path:
        return Path(self.run_dir) / "secrets" / "proxy_admin_key"

    @property
    def engine_key_file(self) -> Path:
        """The embedded engine's control key (the engine, the proxy and the job read it)."""
        return Path(self.run_dir) / "secrets" / "engine_admin_key"

    def run_config(
        self, *, student: str, engine_url: str | None, proxy_url: str | None
    ) -> TrainRunConfig:
        advanced = {"partial_rollout": self.partial_rollout, **self.extra}
        if self.learning_rate is not None:
            advanced["learning_rate"] = self.learning_rate
        if self.continue_from is not None:
            advanced["continue_from"] = self.continue_from
        return TrainRunConfig(
            objective=self.objective,
            mopd_config=self.mopd_config,
            student=student,
            engine_url=engine_url,
            proxy_url=proxy_url,
            output_dir=str(self.output_dir),
            num_steps=self.steps,
            seed=self.seed,
            rollout_batch_size=self.rollout_batch_size,
            backend=self.backend,
            advanced=advanced,
        )
