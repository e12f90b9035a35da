"""Preflight of a training run: everything that must hold before any process starts.

    report = preflight("configs/mopd/embedded.json", objective="mopd")
    report.ok, report.to_dict()          # every problem names its teacher, dataset or option

Three parts, usable one by one (the validation DAG runs them as separate tasks):

* :func:`load_config`: the MOPD JSON parses, types check, paths resolve;
* :func:`route_problems`: each dataset's teacher exists, weights > 0, agent modes, generate
  functions and reward modules import, each dataset's reward task is registered, the
  ``runtime_env_keys`` are set here, dataset files exist;
* :func:`checkpoint_problems`: the student and (for MOPD) every teacher checkpoint is present and
  readable, with the student's architecture, tokenizer and vocabulary;
* :func:`objective_problems`: the MOPD objective's settings on the backend that will run it
  (``dense`` is embedded-only: on ``ray`` it names the memory it would need; ``topk`` beside
  neither ``--allgather-cp`` nor a top-p below 1, its K within the student's vocabulary).

This is the one check of a MOPD config: ``dressage mopd check [CONFIG...]`` (no CONFIG:
``$DRESSAGE_MOPD_CONFIG``) runs :func:`preflight`, the training DAGs' ``validate`` task
runs it, and ``dressage_validate`` runs its three parts as three tasks. A ``tiny-sft:`` teacher
that is not built yet is reported as not built (naming ``dressage assets``), never trained here::

    dressage mopd check configs/mopd/embedded.json [--student PATH] [--objective grpo] [--json]
    dressage mopd check configs/mopd/embedded.json --backend ray --mopd-objective topk \\
        --mopd-topk 16
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dressage.commands import command_parser
from dressage.config.mopd import (
    OBJECTIVE_SLIME_OPTIONS,
    MopdConfig,
    MopdConfigError,
    Problem,
    load_mopd_config,
    mopd_args_defaults,
    slime_objective_problems,
    slime_options,
    validate_mopd_run,
)
from dressage.config.mopd_path import MOPD_CONFIG_ENV, mopd_config_path
from dressage.config.run import DEFAULT_MOPD_OBJECTIVE, DEFAULT_MOPD_TOPK, MOPD_OBJECTIVES
from dressage.tiny.checkpoints import (
    TEACHER_PREFIX,
    CheckpointNotBuiltError,
    find_checkpoint,
    resolve_checkpoint,
)

__all__ = [
    "PreflightReport",
    "DEFAULT_SKILL_FLOOR",
    "checkpoint_problems",
    "load_config",
    "not_built",
    "objective_problems",
    "preflight",
    "route_problems",
    "skill_findings",
    "teacher_skill_problems",
]

Objective = Literal["mopd", "grpo"]


@dataclass
class PreflightReport:
    config: str
    objective: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    teachers: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    runtime_env_keys: list[str] = field(default_factory=list)
    student: str | None = None
    vocab_size: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    def describe(self) -> str:
        head = f"{self.config} ({self.objective}): {len(self.problems)} problem(s)"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


def load_config(path: str) -> tuple[MopdConfig | None, list[Problem]]:
    try:
        return load_mopd_config(path), []
    except MopdConfigError as exc:
        return None, list(exc.problems)


def route_problems(
    config: MopdConfig, *, environ: Mapping[str, str] | None = None
) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the dataset → teacher/reward/generate routes."""
    report = validate_mopd_run(config, mopd_args_defaults(), check_imports=True, environ=environ)
    problems = list(report.problems)
    if not any(p.subject.startswith("reward module") for p in problems):
        problems += _reward_task_problems(config)
    return problems, list(report.warnings)


def _reward_task_problems(config: MopdConfig) -> list[Problem]:
    from dressage.reward.registry import load_reward_modules, registered_rewards

    load_reward_modules(config.reward_modules)
    known = registered_rewards()
    return [
        Problem(f"dataset {ds.name!r}", f"reward task {ds.task!r} is not registered ({known})")
        for ds in config.datasets
        if ds.task and ds.task not in known
    ]


def student_checkpoint(config: MopdConfig, student: str | None) -> str | None:
    return student or (config.student.hf_checkpoint if config.student else None)


def checkpoint_problems(
    config: MopdConfig, *, student: str | None, objective: Objective, mopd_topk: int | None = None
) -> tuple[list[Problem], int | None]:
    """(problems, vocabulary rows of the student) of the student and teacher checkpoints;
    ``mopd_topk``: a ``topk`` run's K, checked against the student's vocabulary."""
    from dressage.training.checkpoints import (
        CheckpointError,
        inspect_checkpoint,
        validate_mopd_checkpoints,
    )

    chosen = student_checkpoint(config, student)
    if not chosen:
        return [
            Problem("student", "no checkpoint given (the student Param or config.student)")
        ], None
    problems: list[Problem] = []
    if objective == "mopd":  # each checkpoint under its own subject, a teacher not built too
        problems += validate_mopd_checkpoints(config, hf_checkpoint=chosen, mopd_topk=mopd_topk)
    try:
        info = inspect_checkpoint(resolve_checkpoint(chosen))
    except (CheckpointError, ValueError, OSError) as exc:
        if objective != "mopd":  # for MOPD the comparison above already reported it
            problems.append(Problem("student", str(exc)))
        return problems, None
    size = info.vocab_rows or (info.tokenizer.size if info.tokenizer else None)
    return problems, size


def partial_config(path: str | Path) -> MopdConfig | None:
    """A config of the student and teachers of ``path`` that load on their own, no datasets:
    what a config that does not load still lets :func:`checkpoint_problems` check."""
    from pydantic import ValidationError

    from dressage.config.mopd import StudentSpec, TeacherSpec
    from dressage.config.mopd_files import resolve_paths

    source = Path(path).expanduser().resolve()
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    named = data.get("teachers")
    teachers = {}
    for tid, raw in (named if isinstance(named, dict) else {}).items():
        try:
            teachers[str(tid)] = TeacherSpec.model_validate(raw)
        except ValidationError:
            continue
    try:
        student = StudentSpec.model_validate(data["student"]) if "student" in data else None
    except ValidationError:
        student = None
    if not teachers and student is None:
        return None
    config = MopdConfig(teachers=teachers, datasets=[], student=student)
    return resolve_paths(config, source.parent, [])


def not_built(
    config: MopdConfig, config_path: str | Path, problems: Sequence[Problem]
) -> list[Problem]:
    """``problems`` with the ``tiny-sft:`` checkpoints the config names that are not built yet
    said once, as the command that builds them, instead of once per place that names each."""
    missing = []
    for spec in config.built_specs():
        try:
            if spec.startswith(TEACHER_PREFIX) and find_checkpoint(spec) is None:
                missing.append(spec)
        except ValueError:  # a malformed spec: its own problem says so
            continue
    if not missing:
        return list(problems)
    said = [str(CheckpointNotBuiltError(spec)) for spec in missing]
    kept = [p for p in problems if not any(text in p.message for text in said)]
    what = f"{len(missing)} tiny checkpoint(s) this config names are not built yet"
    command = f"dressage assets --config {config_path}"
    first = Problem("checkpoints", f"{what}: run `{command}` first (once; minutes on a CPU)")
    return [first, *kept]


Backend = Literal["embedded", "ray"]


def objective_problems(
    *,
    backend: Backend,
    mopd_objective: str,
    mopd_topk: int | None = None,
    mopd_forward_kl_weight: float = 0.0,
    extra_args: Sequence[str] = (),
) -> list[Problem]:
    """What the backend refuses of a MOPD objective's settings, one sentence each naming the
    flags: on ``ray`` what slime's MOPD launch refuses
    (:func:`dressage.config.mopd.slime_objective_problems`, with the slime flags of
    ``extra_args``), on ``embedded`` the same less the refusal of ``dense``, which the embedded
    trainer runs. K against the vocabulary is :func:`checkpoint_problems`'."""
    args = argparse.Namespace(
        mopd_objective=mopd_objective,
        mopd_topk=mopd_topk,
        mopd_forward_kl_weight=mopd_forward_kl_weight,
        **slime_options(extra_args, OBJECTIVE_SLIME_OPTIONS),
    )
    problems = slime_objective_problems(args)
    if backend == "embedded":  # only slime's actor refuses dense (by this subject)
        problems = [p for p in problems if p.subject != "option --mopd-objective"]
    return problems


DEFAULT_SKILL_FLOOR = 0.9
"""Least held-out accuracy on its own task a teacher's ``sft_report.json`` may record."""


def teacher_skill_problems(
    config: MopdConfig, *, floor: float = DEFAULT_SKILL_FLOOR
) -> list[Problem]:
    """Teachers whose measured accuracy on a task routed to them is below ``floor``.

    The measurement is the one a project-built teacher carries (``sft_report.json``'s
    ``agent_accuracy``, taken through the agent loop when it was built); a teacher without one
    (any other checkpoint) is not measured here, and nothing is run to measure it. The caller
    reports the result as warnings, or as problems when skilled teachers are required.
    """
    out: list[Problem] = []
    for tid, teacher in config.teachers.items():
        tasks = sorted({ds.task for ds in config.datasets if ds.teacher_id == tid and ds.task})
        report_path = Path(teacher.load) / "sft_report.json"
        if not tasks or not report_path.is_file():
            continue
        try:
            measured = json.loads(report_path.read_text()).get("agent_accuracy")
        except (OSError, ValueError) as exc:
            out.append(Problem(f"teacher {tid!r}", f"{report_path} is unreadable: {exc}"))
            continue
        if not isinstance(measured, dict):
            out.append(Problem(f"teacher {tid!r}", f"{report_path} records no agent_accuracy"))
            continue
        for task in tasks:
            value = measured.get(task)
            if not isinstance(value, int | float):
                out.append(Problem(f"teacher {tid!r}", f"no measured accuracy on {task!r}"))
            elif value < floor:
                out.append(
                    Problem(
                        f"teacher {tid!r}",
                        f"solves {value:.0%} of held-out {task!r} instances through the agent "
                        f"loop, below the floor of {floor:.0%} ({report_path})",
                    )
                )
    return out


def skill_findings(
    config: MopdConfig, *, objective: Objective, floor: float, required: bool
) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of :func:`teacher_skill_problems` for a MOPD run (GRPO uses no
    teachers): problems when skilled teachers are ``required``, else warnings."""
    if objective != "mopd":
        return [], []
    try:
        found = teacher_skill_problems(config.materialize(resolve_checkpoint), floor=floor)
    except (ValueError, OSError):  # checkpoint_problems reports an unresolvable or unbuilt one
        return [], []
    return (found, []) if required else ([], found)


def preflight(
    config_path: str,
    *,
    objective: Objective = "mopd",
    student: str | None = None,
    environ: Mapping[str, str] | None = None,
    skill_floor: float = DEFAULT_SKILL_FLOOR,
    require_skilled_teachers: bool = False,
    backend: Backend = "embedded",
    mopd_objective: str | None = None,
    mopd_topk: int | None = None,
    mopd_forward_kl_weight: float = 0.0,
) -> PreflightReport:
    """Every check of a run of ``config_path``; with ``mopd_objective`` (a MOPD run) also the
    objective's settings on ``backend`` (:func:`objective_problems`) and a ``topk`` K against
    the student's vocabulary."""
    report = PreflightReport(config=config_path, objective=objective)
    config, report.problems = load_config(config_path)
    if config is None:  # still check the checkpoints of the parts that load
        partial = partial_config(config_path)
        if partial is not None:
            found, _ = checkpoint_problems(partial, student=student, objective=objective)
            report.problems += not_built(partial, config_path, found)
        return report
    report.teachers = sorted(config.teachers)
    report.datasets = [ds.name for ds in config.datasets]
    report.runtime_env_keys = list(config.runtime_env_keys)
    report.student = student_checkpoint(config, student)
    problems, warnings = route_problems(config, environ=environ)
    if objective == "grpo":  # teachers are not used by GRPO; their warnings are noise
        warnings = [w for w in warnings if not w.subject.startswith("teacher")]
    objective_found: list[Problem] = []
    k = None
    if objective == "mopd" and mopd_objective is not None:
        objective_found = objective_problems(
            backend=backend,
            mopd_objective=mopd_objective,
            mopd_topk=mopd_topk,
            mopd_forward_kl_weight=mopd_forward_kl_weight,
        )
        if mopd_objective == "topk":
            k = DEFAULT_MOPD_TOPK if mopd_topk is None else mopd_topk
    ckpt_problems, report.vocab_size = checkpoint_problems(
        config, student=student, objective=objective, mopd_topk=k
    )
    skill_problems, skill_warnings = skill_findings(
        config, objective=objective, floor=skill_floor, required=require_skilled_teachers
    )
    found = problems + objective_found + ckpt_problems + skill_problems
    report.problems = not_built(config, config_path, found)
    report.warnings = warnings + skill_warnings
    return report


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m dressage.launch.preflight",
        description="Check MOPD configs: the config, routes, rewards, checkpoints, teachers' "
        "skill. Exit 1 listing every problem.",
    )
    parser.add_argument(
        "configs",
        nargs="*",
        metavar="CONFIG",
        help=f"MOPD config JSON file(s) (default: ${MOPD_CONFIG_ENV})",
    )
    parser.add_argument("--student", default=None, help="student checkpoint (default: config's)")
    parser.add_argument(
        "--objective", choices=["mopd", "grpo"], default="mopd", help="what the run trains"
    )
    parser.add_argument(
        "--backend",
        choices=["embedded", "ray"],
        default="embedded",
        help="where the run trains: embedded (one process) or ray (slime's Megatron actor); "
        "decides which MOPD objectives are accepted (default: %(default)s)",
    )
    parser.add_argument(
        "--mopd-objective",
        choices=MOPD_OBJECTIVES,
        default=DEFAULT_MOPD_OBJECTIVE,
        help="the MOPD objective whose settings (--mopd-topk, --mopd-forward-kl-weight) are "
        "checked on --backend, as the launcher checks them (default: %(default)s, the job's)",
    )
    parser.add_argument(
        "--mopd-topk",
        type=int,
        default=None,
        metavar="K",
        help=f"K of the topk objective: the teacher's top-K tokens (default: {DEFAULT_MOPD_TOPK})",
    )
    parser.add_argument(
        "--mopd-forward-kl-weight",
        type=float,
        default=0.0,
        metavar="B",
        help="share of the forward KL in the per-token loss of the dense and topk objectives, "
        "in [0, 1]",
    )
    parser.add_argument(
        "--teacher-skill-floor",
        type=float,
        default=DEFAULT_SKILL_FLOOR,
        help="least own-task accuracy a teacher's sft_report.json may record",
    )
    parser.add_argument(
        "--require-skilled-teachers",
        action="store_true",
        help="a teacher below the floor is a problem (default: a warning)",
    )
    parser.add_argument("--json", action="store_true", help="print each report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``dressage mopd check [CONFIG...] [--student PATH] [--objective grpo] [--json]``: exit 0
    when every config can train, 1 listing every problem of each (on stderr; ``--json``: each
    report, one JSON object per line of stdout). No CONFIG: ``$DRESSAGE_MOPD_CONFIG``;
    the MOPD objective's settings are checked against ``--mopd-objective``, the job's default
    unless given, as the launcher checks them."""
    parser = _parser()
    args = parser.parse_args(argv)
    # no CONFIG: the variable, as the launcher's --mopd-config and mopd_train read it
    configs = args.configs or [p for p in [mopd_config_path(None, given_as="CONFIG")] if p]
    if not configs:
        parser.error(f"no MOPD config given: name CONFIG or set {MOPD_CONFIG_ENV}")
    failed = False
    for path in configs:
        report = preflight(
            path,
            objective=args.objective,
            student=args.student,
            skill_floor=args.teacher_skill_floor,
            require_skilled_teachers=args.require_skilled_teachers,
            backend=args.backend,
            mopd_objective=args.mopd_objective,
            mopd_topk=args.mopd_topk,
            mopd_forward_kl_weight=args.mopd_forward_kl_weight,
        )
        failed |= not report.ok
        if args.json:
            print(json.dumps(report.to_dict(), default=str))
            continue
        for warning in report.warnings:
            print(f"warning: {path}: {warning}", file=sys.stderr)
        if report.ok:
            print(
                f"ok: {path}: {len(report.teachers)} teacher(s), {len(report.datasets)} dataset(s)"
            )
        else:
            print(report.describe(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
