"""Preflight of a training run: everything that must hold before any process starts.

    report = preflight("configs/mopd/embedded.json", objective="mopd")
    report.ok, report.to_dict()          # every problem names its teacher, dataset or option

Three parts, usable one by one (the validation DAG runs them as separate tasks):

* :func:`load_config`: the MOPD JSON parses, types check, paths resolve;
* :func:`route_problems`: each dataset's teacher exists, weights > 0, agent modes, generate
  functions and reward modules import, each dataset's reward task is registered, the
  ``runtime_env_keys`` are set here, dataset files exist;
* :func:`checkpoint_problems`: the student and (for MOPD) every teacher checkpoint is present and
  readable, with the student's architecture, tokenizer and vocabulary.

``python -m dressage.launch.preflight CONFIG [--student PATH] [--objective grpo]`` prints the
JSON report and exits 1 when a problem is found.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dressage.config.mopd import (
    MopdConfig,
    MopdConfigError,
    Problem,
    load_mopd_config,
    mopd_args_defaults,
    resolve_checkpoint,
    validate_mopd_run,
)

__all__ = [
    "PreflightReport",
    "DEFAULT_SKILL_FLOOR",
    "checkpoint_problems",
    "load_config",
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
    config: MopdConfig, *, student: str | None, objective: Objective
) -> tuple[list[Problem], int | None]:
    """(problems, vocabulary rows of the student) of the student and teacher checkpoints."""
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
    try:
        materialized = config.materialize()
        student_dir = resolve_checkpoint(chosen)
    except (ValueError, OSError) as exc:
        return [Problem("checkpoint spec", str(exc))], None
    problems: list[Problem] = []
    if objective == "mopd":
        problems += validate_mopd_checkpoints(materialized, hf_checkpoint=str(student_dir))
    try:
        info = inspect_checkpoint(student_dir)
    except (CheckpointError, OSError) as exc:
        if objective != "mopd":  # for MOPD the comparison above already reported it
            problems.append(Problem("student", str(exc)))
        return problems, None
    size = info.vocab_rows or (info.tokenizer.size if info.tokenizer else None)
    return problems, size


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
        found = teacher_skill_problems(config.materialize(), floor=floor)
    except (ValueError, OSError):  # checkpoint_problems reports an unresolvable checkpoint
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
) -> PreflightReport:
    report = PreflightReport(config=config_path, objective=objective)
    config, report.problems = load_config(config_path)
    if config is None:
        return report
    report.teachers = sorted(config.teachers)
    report.datasets = [ds.name for ds in config.datasets]
    report.runtime_env_keys = list(config.runtime_env_keys)
    report.student = student_checkpoint(config, student)
    problems, warnings = route_problems(config, environ=environ)
    if objective == "grpo":  # teachers are not used by GRPO; their warnings are noise
        warnings = [w for w in warnings if not w.subject.startswith("teacher")]
    ckpt_problems, report.vocab_size = checkpoint_problems(
        config, student=student, objective=objective
    )
    skill_problems, skill_warnings = skill_findings(
        config, objective=objective, floor=skill_floor, required=require_skilled_teachers
    )
    report.problems = problems + ckpt_problems + skill_problems
    report.warnings = warnings + skill_warnings
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dressage.launch.preflight")
    parser.add_argument("config")
    parser.add_argument("--student", default=None)
    parser.add_argument("--objective", choices=["mopd", "grpo"], default="mopd")
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
    args = parser.parse_args(argv)
    report = preflight(
        args.config,
        objective=args.objective,
        student=args.student,
        skill_floor=args.teacher_skill_floor,
        require_skilled_teachers=args.require_skilled_teachers,
    )
    print(json.dumps(report.to_dict(), indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
