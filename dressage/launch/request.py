"""A job request: everything needed to launch a job, JSON-safe and free of secret values.

An Airflow task builds one and hands it (as an XCom) to the operator that launches it::

    request = JobRequest(launcher="local", launcher_options={"root": "runs/x/jobs"},
                         entrypoint=["python", "-m", "dressage.jobs.train", "--run-config", p],
                         forward_env=["DRESSAGE_*", "SEARCH_API_KEY"],
                         secret_env_files={"DRESSAGE_PROXY_ADMIN_KEY": "runs/x/secrets/key"})
    spec = request.spec("dressage-dag-run-train", os.environ)

Secrets travel by name (``forward_env``: read from the launching process's environment; a name
ending in ``*`` forwards every variable with that prefix) or by file (``secret_env_files``), and
are resolved only when the job is submitted, so no XCom, Param or log ever holds their values.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dressage.launch.base import JobSpec, LauncherKind, LaunchError

__all__ = ["JobRequest"]


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    launcher: LauncherKind
    launcher_options: dict[str, Any]
    entrypoint: list[str] | str
    env: dict[str, str] = Field(default_factory=dict)
    """Plain, non-secret variables."""
    forward_env: list[str] = Field(default_factory=list)
    secret_env_files: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = None
    timeout_s: float = Field(default=24 * 3600.0, gt=0)
    """The job is stopped and the task fails when it runs longer."""
    poll_s: float = Field(default=5.0, gt=0)
    outputs: dict[str, str] = Field(default_factory=dict)
    """Where the job writes what downstream tasks read (e.g. ``output_dir``); passed through."""

    def resolved_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        env = dict(self.env)
        for name in self.forward_env:
            if name.endswith("*"):
                env.update({k: v for k, v in environ.items() if k.startswith(name[:-1])})
            elif name in environ:
                env[name] = environ[name]
        for name, path in self.secret_env_files.items():
            try:
                env[name] = Path(path).read_text().strip()
            except OSError as exc:
                raise LaunchError(f"cannot read {name} from {path}: {exc}") from exc
        return env

    def spec(self, submission_id: str, environ: Mapping[str, str]) -> JobSpec:
        return JobSpec(
            entrypoint=self.entrypoint,
            submission_id=submission_id,
            env=self.resolved_env(environ),
            working_dir=self.working_dir,
        )
