"""The work behind the DAGs' ``@task``s, as plain functions of JSON-able values.

Each DAG task is a line or two that calls one of these with its inputs and its Airflow context.
Failures that running again cannot fix (an invalid config, a failed job, failing data checks, an
unwritable artifact root) raise :class:`AirflowFailException`, which skips the retries; the
message names the cause: the config field, teacher or dataset, the job and its log tail, the URL.
Heavy modules (torch through checkpoints, polars through pandera, matplotlib) are imported
inside the functions that need them.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from dressage.airflow.assets import ASSETS, STUDENTS
from dressage.airflow.param_checks import training_problems, validation_problems
from dressage.airflow.plan import RunPlan, resolve_path
from dressage.airflow.story import curves_path, staged_summary, tell
from dressage.config.job import advanced_problems
from dressage.config.mopd import Problem
from dressage.launch.base import LaunchError, sanitize_id
from dressage.launch.request import JobRequest
from dressage.launch.train_job import DEFAULT_JOB_MODULE, job_module, train_entrypoint

if TYPE_CHECKING:
    from dressage.launch.preflight import PreflightReport

__all__ = [
    "check_checkpoints",
    "check_routes",
    "check_table",
    "load_validation",
    "plan_run",
    "prepare_checkpoints",
    "prepare_job",
    "publish",
    "stage",
    "start_services",
    "stop_services",
    "validate_run",
    "validation_verdict",
]

ADMIN_KEY_ENV = "DRESSAGE_PROXY_ADMIN_KEY"
ENGINE_KEY_ENV = "DRESSAGE_ENGINE_ADMIN_KEY"
log = logging.getLogger(__name__)


def _problems(items: Sequence[Any]) -> list[dict[str, str]]:
    return [{"subject": p.subject, "message": p.message} for p in items]


def _lines(problems: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(f"  - {p['subject']}: {p['message']}" for p in problems)


def _write_json(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


# -- training DAGs ----------------------------------------------------------------------------


def _values_to_fix(problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    listed = "\n".join(f"  - {p}" for p in problems)
    return f"{len(problems)} values of the trigger form to fix:\n{listed}"


def plan_run(context: Context, *, objective: str, project_dir: Path) -> dict[str, Any]:
    """The run's typed plan from its Params: types were checked at trigger time, ranges and
    URL schemes here (:mod:`dressage.airflow.param_checks`), one sentence per bad value."""
    problems = training_problems(context["params"])
    if problems:
        raise AirflowFailException(_values_to_fix(problems))
    plan = RunPlan.from_params(
        context["params"],
        dag_id=context["dag"].dag_id,
        run_id=context["run_id"],
        objective=objective,
        project_dir=project_dir,
    )
    plan = plan.model_copy(update=continue_from(context, plan, project_dir))
    problems = job_settings_problems(plan)
    if problems:
        raise AirflowFailException(_values_to_fix(problems))
    return plan.model_dump(mode="json")


def continue_from(context: Context, plan: RunPlan, project_dir: Path) -> dict[str, Any]:
    """The ``continue_from`` Param resolved to a checkpoint folder (``RunPlan`` fields).

    Empty means ``latest`` for a scheduled run and ``fresh`` otherwise. ``latest`` is the
    newest event of the DAG's student Asset (:data:`~dressage.airflow.assets.STUDENTS`) that
    this DAG published with a checkpoint; with none, the run starts fresh. A checkpoint that
    is not there (named, or published and since removed) fails the plan in one sentence; so
    does, on the ray backend, one saved without its data position."""
    value = str(context["params"].get("continue_from") or "").strip()
    if not value:
        run_type = str(getattr(context.get("dag_run"), "run_type", "") or "")
        value = "latest" if run_type.lower().endswith("scheduled") else "fresh"
    if value == "fresh":
        return {"continue_from": None, "continue_mode": "fresh", "parent_run": None}
    parent = None
    if value == "latest":
        found = _latest_student(context, plan)
        if found is None:
            log.info("continue_from latest: %s has published no student yet: fresh", plan.dag_id)
            return {"continue_from": None, "continue_mode": "fresh", "parent_run": None}
        value, parent = found
    elif "://" not in value:
        value = str(resolve_path(value, project_dir))
    folder = _checkpoint_folder(value, plan.backend)
    log.info("continue_from: %s (published by %s)", folder, parent or "-")
    mode = "latest" if parent is not None else "checkpoint"
    return {"continue_from": str(folder), "continue_mode": mode, "parent_run": parent}


def _latest_student(context: Context, plan: RunPlan) -> tuple[str, str | None] | None:
    """(checkpoint, run id) of the newest student event this DAG published with a checkpoint."""
    events = context["inlet_events"][STUDENTS[plan.objective]]
    for event in reversed(list(events)):
        extra = dict(event.extra or {})
        if extra.get("checkpoint") and extra.get("dag_id", plan.dag_id) == plan.dag_id:
            run_id = extra.get("run_id")
            return str(extra["checkpoint"]), str(run_id) if run_id is not None else None
    return None


def latest_run_checkpoint(root: Path, backend: str) -> Path | None:
    """The newest complete checkpoint under ``root`` in the backend's format: the embedded
    trainer's (:func:`~dressage.training.embedded.checkpoint.latest_checkpoint`), or a slime
    run's Megatron checkpoint (its tracker's iteration folder); None when there is none.

    Raises:
        CheckpointError: an embedded checkpoint folder that cannot be read.
    """
    from dressage.training.embedded.checkpoint import latest_checkpoint

    if backend != "ray":
        return latest_checkpoint(root)
    from dressage.slime.continue_from import ContinueError, megatron_checkpoint

    try:
        top, iteration = megatron_checkpoint(root)
    except ContinueError:
        return None
    return top / f"iter_{iteration:07d}"


def _checkpoint_folder(value: str, backend: str) -> Path:
    """The complete checkpoint ``value`` names, or the plan fails saying why."""
    from dressage.training.checkpoints import CheckpointError
    from dressage.training.embedded.checkpoint import checkpoint_location

    try:
        root = checkpoint_location(value)
        folder = latest_run_checkpoint(root, backend) if root.exists() else None
    except CheckpointError as exc:
        raise AirflowFailException(f"Continue from (continue_from): {exc}") from None
    if folder is None:
        where = "does not exist" if not root.exists() else "holds no checkpoint"
        raise AirflowFailException(
            f"Continue from (continue_from): {value} {where}; name a run's output/checkpoints "
            "folder, or enter fresh or latest"
        )
    if backend == "ray":
        from dressage.slime.continue_from import data_state_path

        iteration = int(folder.name.split("_")[1])
        state = data_state_path(folder.parent, iteration)
        if not state.is_file():
            raise AirflowFailException(
                f"Continue from (continue_from): {folder} has no data position ({state} does "
                "not exist), so the run could not continue that run's prompts"
            )
    return folder


def job_settings_problems(plan: RunPlan) -> list[str]:
    """What the job would refuse in the run's settings (``extra``, the form's learning rate and
    partial rollout, as RUN.json's ``advanced``), found before anything is launched. Only the
    project's job is checked: another job module (``DRESSAGE_JOB_MODULE``) reads ``advanced``
    its own way."""
    if job_module() != DEFAULT_JOB_MODULE:
        return []
    run = plan.run_config(student=plan.student or "", engine_url=None, proxy_url=None)
    return [
        f"More job settings (extra): {problem.removeprefix('advanced.')}"
        for problem in advanced_problems(run)
    ]


def prepare_checkpoints(plan_data: Mapping[str, Any]) -> dict[str, Any]:
    """Build the ``tiny-sft:`` teachers (and ``tiny:`` models) the run's config and student name
    that are not built yet: the embedded default's one-time step, so that validation finds them
    (it never trains). A checkpoint that is a folder is never built; a config that does not load
    is left for ``validate`` to report."""
    from dressage.config.mopd import MopdConfigError, load_mopd_config
    from dressage.tiny.checkpoints import build_checkpoints, find_checkpoint, is_built_spec

    plan = RunPlan.model_validate(plan_data)
    try:
        specs = load_mopd_config(plan.mopd_config).built_specs()
    except MopdConfigError as exc:
        log.warning("prepare: the config does not load; validate reports why (%s)", exc)
        return {"built": [], "found": []}
    if plan.student and is_built_spec(plan.student):
        specs = list(dict.fromkeys([*specs, plan.student]))
    found = [spec for spec in specs if find_checkpoint(spec) is not None]
    missing = [spec for spec in specs if spec not in found]
    built = []
    for spec, outcome in zip(missing, build_checkpoints(missing), strict=True):
        if isinstance(outcome, ValueError):  # a malformed spec: validate names it
            log.warning("prepare: %s", outcome)
            continue
        log.info("prepare: %s -> %s", spec, outcome)
        built.append(spec)
    return {"built": built, "found": found}


def validate_run(plan_data: Mapping[str, Any]) -> dict[str, Any]:
    """Config, routes, checkpoints (and the Ray address); fails closed with a report.

    The report is kept in the run folder (``preflight.json``) either way.
    """
    from dressage.launch.preflight import preflight

    plan = RunPlan.model_validate(plan_data)
    report = preflight(plan.mopd_config, objective=plan.objective, student=plan.student)
    ray_version = _ray_version(plan.ray_address, report) if plan.backend == "ray" else None
    data = {**report.to_dict(), "ray_version": ray_version}
    path = _write_json(Path(plan.run_dir) / "preflight.json", data)
    for warning in report.warnings:
        log.warning("%s", warning)
    if not report.ok:
        raise AirflowFailException(f"{report.describe()}\nreport: {path}")
    return data


def _ray_version(address: str, report: PreflightReport) -> str | None:
    """The cluster's Ray version, or a problem in ``report`` naming the unreachable address."""
    from dressage.launch.ray_jobs import RayJobsLauncher

    try:
        return RayJobsLauncher(address, timeout_s=10).ping()
    except LaunchError as exc:
        report.problems.append(Problem("ray_address", str(exc)))
        return None


def start_services(plan_data: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """The engine and the proxy for an embedded run; nothing on the ray backend (the job's own)."""
    plan = RunPlan.model_validate(plan_data)
    if plan.backend == "ray":
        log.info("ray backend: the engines and the proxy run inside the job on the cluster")
        return {"launcher": None, "engine_url": None, "proxy_url": None, "submission_ids": []}
    from dressage.launch.local import LocalLauncher
    from dressage.launch.services import ServicePlan
    from dressage.launch.services import start_services as start
    from dressage.tiny.checkpoints import resolve_checkpoint

    launcher = LocalLauncher(plan.jobs_dir)
    service_plan = ServicePlan(
        student=resolve_checkpoint(str(report["student"])),
        store_dir=Path(plan.run_dir) / "proxy-store",
        admin_key_file=plan.admin_key_file,
        engine_key_file=plan.engine_key_file,
        id_prefix=sanitize_id(f"dressage-{plan.dag_id}-{plan.run_slug}"),
        partial_rollout=plan.partial_rollout,
    )
    try:
        services = start(launcher, service_plan)
    except LaunchError as exc:  # retried: a port taken meanwhile, a slow machine
        raise AirflowException(str(exc)) from exc
    log.info("engine %s  proxy %s", services.engine_url, services.proxy_url)
    return {
        "launcher": launcher.options(),
        "engine_url": services.engine_url,
        "proxy_url": services.proxy_url,
        "submission_ids": services.submission_ids,
    }


def stop_services(services: Mapping[str, Any]) -> dict[str, str]:
    if not services.get("launcher"):
        return {}
    from dressage.launch.local import LocalLauncher
    from dressage.launch.services import stop_services as stop

    states = stop(LocalLauncher(**services["launcher"]), list(services["submission_ids"]))
    log.info("services stopped: %s", states)
    return states


def prepare_job(
    plan_data: Mapping[str, Any], services: Mapping[str, Any], report: Mapping[str, Any]
) -> dict[str, Any]:
    """Write RUN.json and describe the training job for :class:`RunJobOperator`."""
    plan = RunPlan.model_validate(plan_data)
    run_config = plan.run_config(
        student=str(report["student"]),
        engine_url=services.get("engine_url"),
        proxy_url=services.get("proxy_url"),
    )
    path = run_config.write(plan.run_config_path)
    common: dict[str, Any] = {
        "env": {"PYTHONUNBUFFERED": "1"},
        "working_dir": plan.run_dir,
        "timeout_s": plan.job_timeout_s,
        "poll_s": plan.poll_s,
        "outputs": {"output_dir": str(plan.output_dir)},
    }
    if plan.backend == "ray":
        from dressage.launch.services import write_secret

        write_secret(plan.admin_key_file)  # the proxy the job starts on the cluster uses it
        request = JobRequest(
            launcher="ray",
            launcher_options={"address": plan.ray_address},
            entrypoint=train_entrypoint(path, python=plan.ray_python),
            forward_env=["DRESSAGE_*", *report.get("runtime_env_keys", [])],
            secret_env_files={ADMIN_KEY_ENV: str(plan.admin_key_file)},
            **common,
        )
    else:
        request = JobRequest(
            launcher="local",
            launcher_options={"root": str(plan.jobs_dir)},
            entrypoint=train_entrypoint(path, python=sys.executable),
            secret_env_files={
                ADMIN_KEY_ENV: str(plan.admin_key_file),
                ENGINE_KEY_ENV: str(plan.engine_key_file),  # its weight updates
            },
            **common,
        )
    return request.model_dump(mode="json")


def stage(
    plan_data: Mapping[str, Any], result: Mapping[str, Any], report: Mapping[str, Any]
) -> dict[str, Any]:
    """Plot the curves, then stage the job's output to the artifact root (manifest last)."""
    from dressage.reporting.curves import plot_curves
    from dressage.reporting.metrics import (
        ACCURACY,
        HELDOUT_KL,
        REVERSE_KL,
        REWARD,
        read_metrics,
        series,
    )
    from dressage.staging.stage import StagingError, stage_run

    plan = RunPlan.model_validate(plan_data)
    output = Path(result["outputs"]["output_dir"])
    metrics = output / "metrics.jsonl"
    if metrics.is_file():
        records = read_metrics(metrics)
        found = (ACCURACY, HELDOUT_KL, REVERSE_KL, REWARD)
        families = [f for f in found if series(records, f)]
        plot_curves(
            records,
            output / "curves.png",
            families=families or (REVERSE_KL, REWARD),
            title=f"{plan.dag_id} {plan.run_id}",
        )
    metadata = {
        "dag_id": plan.dag_id,
        "run_id": plan.run_id,
        "objective": plan.objective,
        "backend": plan.backend,
        "steps": plan.steps,
        "teachers": list(report.get("teachers", [])) if plan.objective == "mopd" else [],
    }
    try:
        staged = stage_run(str(output), plan.artifact_url, metadata=metadata)
    except StagingError as exc:
        raise AirflowFailException(f"staging to {plan.artifact_url} failed: {exc}") from exc
    verb = "already staged" if staged.already_staged else f"staged {staged.files_copied} files"
    log.info("%s: %d rollouts at %s", verb, len(staged.rollouts), staged.url)
    return staged.to_dict()


def check_table(staged: Mapping[str, Any], kind: str, report: Mapping[str, Any]) -> dict[str, Any]:
    """pandera checks of one table kind over the staged run; any failure fails the task."""
    from dressage.staging.checks import check_run_tables, describe_failures

    result = check_run_tables(str(staged["url"]), kind, vocab_size=report.get("vocab_size"))
    if not result["ok"]:
        raise AirflowFailException(
            f"{kind} checks failed for {staged['url']} (report: {result['report_url']}):\n"
            f"{describe_failures(result)}"
        )
    log.info("%s: %d rows in %d rollouts pass", kind, result["rows"], len(result["rollouts"]))
    return {
        "table": kind,
        "rows": result["rows"],
        "rollouts": len(result["rollouts"]),
        "report_url": result["report_url"],
    }


def publish(
    plan_data: Mapping[str, Any],
    staged: Mapping[str, Any],
    checks: Sequence[Mapping[str, Any]],
    context: Context,
) -> dict[str, Any]:
    """Asset events with the staged run's URL, check results and curves; the run's note (the
    summary with the artifact URL and the curves, as the UI opens them); returns the summary.

    The summary table itself is logged once, at the end of the train task's log."""
    plan = RunPlan.model_validate(plan_data)
    url = str(staged["url"])
    curves = curves_path(plan.dag_id, plan.run_id)
    student = published_student(plan)
    context["outlet_events"][STUDENTS[plan.objective]].extra = student
    for check in checks:
        asset = ASSETS[plan.objective][str(check["table"])]
        context["outlet_events"][asset].extra = {
            "url": url,
            "report": check["report_url"],
            "rows": check["rows"],
            "rollouts": check["rollouts"],
            "dag_id": plan.dag_id,
            "run_id": plan.run_id,
            "curves": curves,
        }
    started = started_from_line(plan)
    told = staged_summary(url, objective=plan.objective, curves_link=curves, started=started)
    tell(context, told.markdown)
    names = [*ASSETS[plan.objective], "student"]
    log.info("published %s; %s; the summary is in the run's note", ", ".join(names), started)
    return {
        "summary": {**told.data, "started_from": started},
        "text": told.text,
        "student": student,
    }


def started_from_line(plan: RunPlan) -> str:
    """One sentence for the note: what the run started from."""
    if plan.continue_from is None:
        return "Started from: the config's student, fresh (continue_from: fresh)."
    parent = f", published by run {plan.parent_run}" if plan.parent_run else ""
    return f"Started from: `{plan.continue_from}`{parent} (continue_from: {plan.continue_mode})."


def published_student(plan: RunPlan) -> dict[str, Any]:
    """The student Asset event's extra: the last checkpoint the job wrote (as a ``file://`` URL;
    None when it wrote none), the steps, held-out accuracy per task after the last step, the
    parent run."""
    from dressage.reporting.metrics import ACCURACY, read_metrics, series
    from dressage.training.checkpoints import CheckpointError

    try:
        checkpoint = latest_run_checkpoint(plan.output_dir / "checkpoints", plan.backend)
    except CheckpointError as exc:
        log.warning("no checkpoint to publish: %s", exc)
        checkpoint = None
    metrics = plan.output_dir / "metrics.jsonl"
    accuracy = {
        task: points[-1][1]
        for task, points in series(
            read_metrics(metrics) if metrics.is_file() else [], ACCURACY
        ).items()
        if points and task != "all"
    }
    return {
        "checkpoint": checkpoint.resolve().as_uri() if checkpoint is not None else None,
        "steps": plan.steps,
        "accuracy": accuracy,
        "parent_run": plan.parent_run,
        "continue_from": plan.continue_from,
        "dag_id": plan.dag_id,
        "run_id": plan.run_id,
    }


# -- the validation DAG -----------------------------------------------------------------------


def load_validation(context: Context, *, project_dir: Path) -> dict[str, Any]:
    """Resolve the Params and try the config. Never fails: a config that does not load (and a
    trigger-form value out of range) become problems of the one report that ``report`` writes.
    """
    from dressage.launch.preflight import DEFAULT_SKILL_FLOOR, load_config

    params = context["params"]
    config_path = str(resolve_path(str(params["mopd_config"]), project_dir))
    student = params.get("student") or None
    if student and not str(student).startswith("tiny:"):
        student = str(resolve_path(str(student), project_dir))
    run_dir = resolve_path(str(params["run_root"]), project_dir)
    run_dir = run_dir / context["dag"].dag_id / sanitize_id(context["run_id"])
    floor = params.get("teacher_skill_floor")
    config, problems = load_config(config_path)
    form = [{"subject": "trigger form", "message": p} for p in validation_problems(params)]
    spec = {
        "config": config_path,
        "student": student,
        "objective": params["objective"],
        "teacher_skill_floor": float(DEFAULT_SKILL_FLOOR if floor is None else floor),
        "require_skilled_teachers": bool(params.get("require_skilled_teachers")),
        "report_path": str(run_dir / "report.json"),
        "config_loaded": config is not None,
        "load_problems": form + _problems(problems),
    }
    for problem in spec["load_problems"]:
        log.error("%s: %s", problem["subject"], problem["message"])
    return spec


def check_routes(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Route problems; nothing to check when the config did not load (already a problem)."""
    from dressage.launch.preflight import load_config, route_problems

    config, _ = load_config(str(spec["config"])) if spec.get("config_loaded", True) else (None, [])
    if config is None:
        return {"problems": [], "warnings": [], "skipped": "the config did not load"}
    problems, warnings = route_problems(config)
    return {"problems": _problems(problems), "warnings": _problems(warnings)}


def check_checkpoints(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Checkpoint problems and teachers' skill; nothing when the config did not load."""
    from dressage.launch.preflight import (
        checkpoint_problems,
        load_config,
        skill_findings,
    )

    config, _ = load_config(str(spec["config"])) if spec.get("config_loaded", True) else (None, [])
    if config is None:
        return {"problems": [], "warnings": [], "vocab_size": None}
    problems, vocab = checkpoint_problems(
        config, student=spec.get("student"), objective=spec["objective"]
    )
    skill_problems: list[Problem] = []
    warnings: list[Problem] = []
    if not spec.get("load_problems"):  # a floor out of range is already the problem to fix
        skill_problems, warnings = skill_findings(
            config,
            objective=spec["objective"],
            floor=float(spec["teacher_skill_floor"]),
            required=bool(spec.get("require_skilled_teachers", False)),
        )
    return {
        "problems": _problems(problems + skill_problems),
        "warnings": _problems(warnings),
        "vocab_size": vocab,
    }


def validation_verdict(
    spec: Mapping[str, Any], routes: Mapping[str, Any], checkpoints: Mapping[str, Any]
) -> dict[str, Any]:
    """One report of every problem (the config's loading, routes, checkpoints); written beside
    the run, and the task fails if any."""
    problems = [*spec.get("load_problems", []), *routes["problems"], *checkpoints["problems"]]
    report = {
        **{k: v for k, v in spec.items() if k not in ("load_problems", "config_loaded")},
        "ok": not problems,
        "problems": problems,
        "warnings": [*routes["warnings"], *checkpoints.get("warnings", [])],
        "vocab_size": checkpoints.get("vocab_size"),
    }
    path = _write_json(Path(spec["report_path"]), report)
    if problems:
        raise AirflowFailException(
            f"{spec['config']}: {len(problems)} problem(s):\n{_lines(problems)}\nreport: {path}"
        )
    log.info("ok: %s (report: %s)", spec["config"], path)
    return report
