"""One builder from a MOPD run config to slime's command line, used by every launcher.

It validates first and fails closed, listing every problem: the MOPD config, the options against
the objective (one sample per prompt, one step per rollout, no KL/entropy/PPO ratio/OPD), the
MOPD objective's settings (``dense`` is embedded-only; ``topk`` beside neither ``--allgather-cp``
nor a ``--rollout-top-p`` below 1, its K within the student's vocabulary), hook imports, the
forwarded environment, and every checkpoint (architecture, tokenizer, vocabulary). Then it emits
``python -m dressage.training.mopd_train`` with every flag. Secrets (the config's
``runtime_env_keys``, ``WANDB_API_KEY``) go into the Ray runtime environment, never into argv::

    python -m dressage.launch.slime_command --mopd-config configs/mopd/embedded.json \\
        --output-dir runs/demo --dry-run                  # print the command
    python -m dressage.launch.slime_command ... --submit  # ray job submit (RAY_ADDRESS)
    python -m dressage.launch.slime_command ... --exec    # run it here (inside a Ray job)

scripts/run_mopd_qwen3.5_sync.sh wraps it. A Ray Jobs API caller (the MOPD DAG) uses the same
builder: ``job = build_mopd_job(run)``, ``write_job_files(job)`` (the command reads the resolved
config it writes), then ``submit_job(entrypoint=job.entrypoint, runtime_env=job.runtime_env,
submission_id=job.submission_id)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dressage.commands import command_parser, did_you_mean, field_help
from dressage.config.layered import SettingsError
from dressage.config.mopd import (
    MOPD_HOOKS,
    OBJECTIVE_SLIME_OPTIONS,
    MopdConfig,
    MopdConfigError,
    Problem,
    load_mopd_config,
    slime_objective_problems,
    slime_options,
    validate_mopd_run,
)
from dressage.config.mopd_path import mopd_config_env
from dressage.config.run import (
    DEFAULT_MOPD_TOPK,
    MOPD_OBJECTIVES,
    ClusterLayout,
    MopdRunConfig,
    MopdRunSettings,
    RaySubmitSettings,
)
from dressage.launch.preflight import not_built, partial_config
from dressage.slime.hooks import ROLLOUT_LOG_HOOK
from dressage.tiny.checkpoints import resolve_checkpoint

__all__ = [
    "MopdJob",
    "build_mopd_command",
    "build_mopd_job",
    "layout_flags",
    "readable",
    "submit_argv",
    "write_config",
    "write_job_files",
]

DRIVER_MODULE = "dressage.training.mopd_train"
# Options a slime command may carry in extra_args that decide whether the run is MOPD; parsed
# so that validate_mopd_run sees them (attribute names as slime's parser would set them).
_CONTRADICTING: tuple[tuple[str, str, Any], ...] = (
    ("--use-kl-loss", "use_kl_loss", "store_true"),
    ("--kl-coef", "kl_coef", float),
    ("--kl-loss-coef", "kl_loss_coef", float),
    ("--entropy-coef", "entropy_coef", float),
    ("--use-opd", "use_opd", "store_true"),
    ("--num-steps-per-rollout", "num_steps_per_rollout", int),
    ("--normalize-advantages", "normalize_advantages", "store_true"),
    ("--advantage-estimator", "advantage_estimator", str),
    ("--disable-compute-advantages-and-returns", "compute_advantages_and_returns", "store_false"),
)
# The objective's flags: set by the run config's fields only, never by extra_args.
_OBJECTIVE_FLAGS = frozenset(
    {"--mopd-advantage-clip", "--mopd-objective", "--mopd-topk", "--mopd-forward-kl-weight"}
)
_SECRET_WORDS = ("key", "token", "secret", "password")


@dataclass(frozen=True)
class MopdJob:
    """A validated launch: the command, what it needs beside it, and its Ray job identity."""

    argv: list[str]
    submission_id: str
    resolved_config: Path
    """Where the resolved MOPD config (absolute paths, tiny models built) is written."""
    config_json: str
    runtime_env_file: Path
    metrics_dir: Path
    env: dict[str, str] = field(repr=False)
    """Variables forwarded to every Ray worker; may hold secrets, so never printed."""

    @property
    def entrypoint(self) -> str:
        return shlex.join(self.argv)

    @property
    def runtime_env(self) -> dict[str, Any]:
        return {"env_vars": dict(self.env)}


def build_mopd_command(
    run: MopdRunConfig, *, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The validated ``python -m dressage.training.mopd_train ...`` argv."""
    return build_mopd_job(run, environ=environ).argv


def build_mopd_job(run: MopdRunConfig, *, environ: Mapping[str, str] | None = None) -> MopdJob:
    """Validate everything, then build the job; raise :class:`MopdConfigError` listing all.

    A config that does not load still has its checkpoints checked (those of the student and
    teachers that load on their own) with the run's own options, as ``dressage mopd check``
    does: one attempt shows every problem."""
    from dressage.training.checkpoints import validate_mopd_checkpoints

    env = dict(os.environ if environ is None else environ)
    out = Path(run.output_dir).expanduser().resolve()
    problems: list[Problem] = []
    try:
        config: MopdConfig | None = load_mopd_config(run.mopd_config)
    except MopdConfigError as exc:  # still check what does not need the config, as mopd check
        problems += exc.problems
        config = None
    loaded = config is not None
    if config is None:
        # the student and teachers that load on their own (partial_config), as mopd check does
        config = partial_config(run.mopd_config) or MopdConfig(teachers={}, datasets=[])
    try:
        config = config.materialize(resolve_checkpoint)
    except ValueError as exc:
        problems.append(Problem("checkpoint spec", str(exc)))
    student = config.student
    hf = run.hf_checkpoint or (student.hf_checkpoint if student else None)
    ref = run.ref_load or (student.ref_load if student else None)
    step = run.ref_ckpt_step
    if step is None and student is not None:
        step = student.ckpt_step
    base = _argv(run, config, out, hf or "", ref, step)
    problems += _extra_arg_problems(run.extra_args, owned=_flags_in(base) | _OBJECTIVE_FLAGS)
    argv = base + list(run.extra_args)
    view = _args_view(run, argv)
    if loaded:
        report = validate_mopd_run(config, view, check_imports=run.check_imports, environ=env)
        problems += report.problems
    problems += slime_objective_problems(view)
    k = DEFAULT_MOPD_TOPK if run.mopd_topk is None else run.mopd_topk
    if loaded or config.teachers or config.student:
        problems += validate_mopd_checkpoints(
            config,
            hf_checkpoint=hf,
            ref_load=ref,
            ckpt_step=step,
            mopd_topk=k if run.mopd_objective == "topk" else None,
        )
    problems += _wandb_problems(run, env)
    if problems:
        problems = not_built(config, run.mopd_config, problems)
        raise MopdConfigError(problems, source=f"MOPD launch of {run.mopd_config}")
    forwarded = {key: env[key] for key in config.runtime_env_keys}
    if run.use_wandb:
        forwarded.update({k: env[k] for k in ("WANDB_API_KEY", "WANDB_MODE") if env.get(k)})
    forwarded.update(mopd_config_env(out / "mopd_config.resolved.json"))  # both spellings
    config_json = config.model_dump_json(indent=2)
    digest = hashlib.sha256(json.dumps([argv, sorted(forwarded)]).encode()).hexdigest()[:16]
    return MopdJob(
        argv=argv,
        submission_id=f"mopd-{digest}",
        resolved_config=out / "mopd_config.resolved.json",
        config_json=config_json,
        runtime_env_file=out / "runtime_env.json",
        metrics_dir=out / "metrics",
        env=forwarded,
    )


def _argv(
    run: MopdRunConfig,
    config: MopdConfig,
    out: Path,
    hf: str,
    ref: str | None,
    ref_step: int | None,
) -> list[str]:
    ckpt = str(out / "checkpoints")
    n, rbs = run.n_samples_per_prompt, run.rollout_batch_size
    argv = [run.python, "-m", DRIVER_MODULE]
    argv += ["--mopd-config", str(out / "mopd_config.resolved.json")]
    argv += ["--mopd-metrics-dir", str(out / "metrics")]
    if run.mopd_advantage_clip is not None:
        argv += ["--mopd-advantage-clip", str(run.mopd_advantage_clip)]
    argv += ["--mopd-objective", run.mopd_objective]
    if run.mopd_topk is not None:
        argv += ["--mopd-topk", str(run.mopd_topk)]
    if run.mopd_forward_kl_weight:
        argv += ["--mopd-forward-kl-weight", str(run.mopd_forward_kl_weight)]
    argv += ["--hf-checkpoint", hf]
    if ref:
        argv += ["--ref-load", ref]
    if ref_step is not None:
        argv += ["--ref-ckpt-step", str(ref_step)]
    argv += ["--load", run.load or ckpt, "--save", run.save or ckpt]
    argv += ["--save-interval", str(run.save_interval)]
    argv += layout_flags(run)
    argv += ["--num-rollout", str(run.num_rollout)]
    argv += ["--rollout-batch-size", str(rbs), "--n-samples-per-prompt", str(n)]
    argv += ["--global-batch-size", str(run.global_batch_size or rbs * n)]
    argv += ["--rollout-max-response-len", str(run.rollout_max_response_len)]
    argv += ["--rollout-temperature", str(run.rollout_temperature)]
    argv += ["--seed", str(run.seed), "--rollout-seed", str(run.rollout_seed)]
    argv += ["--loss-type", "custom_loss"]
    hooks = dict(MOPD_HOOKS)
    if all(ds.generate_function_path for ds in config.datasets):
        hooks.pop("custom_generate_function_path")  # every dataset brings its own
    for attr, path in hooks.items():
        argv += ["--" + attr.replace("_", "-"), path]
    argv += ["--custom-rollout-log-function-path", ROLLOUT_LOG_HOOK]
    argv += ["--disable-rewards-normalization"]
    return argv


def layout_flags(layout: ClusterLayout) -> list[str]:
    """slime's flags for a cluster layout: parallelism, GPUs, micro-batching budget, W&B."""
    argv = ["--tensor-model-parallel-size", str(layout.tp_size)]
    argv += ["--context-parallel-size", str(layout.cp_size)]
    argv += ["--pipeline-model-parallel-size", str(layout.pp_size)]
    argv += ["--actor-num-nodes", str(layout.actor_num_nodes)]
    argv += ["--actor-num-gpus-per-node", str(layout.actor_num_gpus_per_node)]
    if layout.colocate:
        argv += ["--colocate"]
    elif layout.rollout_num_gpus is not None:
        argv += ["--rollout-num-gpus", str(layout.rollout_num_gpus)]
    argv += ["--rollout-num-gpus-per-engine", str(layout.rollout_num_gpus_per_engine)]
    if layout.max_tokens_per_gpu is not None:
        argv += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(layout.max_tokens_per_gpu)]
    if layout.use_wandb:
        argv += ["--use-wandb"]
        argv += ["--wandb-project", layout.wandb_project] if layout.wandb_project else []
        argv += ["--wandb-group", layout.wandb_group] if layout.wandb_group else []
    return argv


def _flags_in(argv: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


# Flags the launcher sets from a field of another name (besides SLIME_SPELLINGS).
_SET_FROM: Mapping[str, str] = {
    "--mopd-metrics-dir": "output_dir",
    "--use-dynamic-batch-size": "max_tokens_per_gpu",
}


def _owner(flag: str) -> str:
    """Why ``flag`` may not follow ``--``: the run config field (and launcher flag) that sets
    it, or that MOPD fixes it."""
    spelled = {slime: name for name, slime in SLIME_SPELLINGS.items()}
    name = spelled.get(flag) or _SET_FROM.get(flag) or flag[2:].replace("-", "_")
    if name in MopdRunConfig.model_fields:
        given = f"{_flag(name)} before -- (the run config's {name})"
        return f"set by the launcher; give {given} instead"
    return "set by the launcher to what MOPD needs; it cannot be changed"


def _extra_arg_problems(extra: Sequence[str], *, owned: set[str]) -> list[Problem]:
    problems = []
    for flag in sorted(_flags_in(extra)):
        if flag in owned:
            problems.append(Problem(f"option {flag}", _owner(flag)))
        if any(word in flag.lower() for word in _SECRET_WORDS):
            problems.append(
                Problem(f"option {flag}", "credentials never go on the command line; export it")
            )
    return problems


def _args_view(run: MopdRunConfig, argv: Sequence[str]) -> SimpleNamespace:
    """What slime's parser would make of the options the checks care about."""
    view = slime_options(run.extra_args, (*_CONTRADICTING, *OBJECTIVE_SLIME_OPTIONS))
    # argv is our own: the last value of a repeated flag wins, as in argparse.
    owned = dict(zip(argv, argv[1:], strict=False))
    view.update(
        n_samples_per_prompt=run.n_samples_per_prompt,
        rollout_batch_size=run.rollout_batch_size,
        global_batch_size=int(owned["--global-batch-size"]),
        loss_type=owned["--loss-type"],
        rewards_normalization="--disable-rewards-normalization" not in argv,
        mopd_objective=run.mopd_objective,
        mopd_topk=run.mopd_topk,
        mopd_forward_kl_weight=run.mopd_forward_kl_weight,
    )
    for attr in MOPD_HOOKS:
        flag = "--" + attr.replace("_", "-")
        if flag in owned:
            view[attr] = owned[flag]
    return SimpleNamespace(**view)


def _wandb_problems(run: MopdRunConfig, env: Mapping[str, str]) -> list[Problem]:
    if not run.use_wandb:
        return []
    problems = []
    if not run.wandb_project:
        problems.append(Problem("option --wandb-project", "W&B is enabled without a project"))
    if not env.get("WANDB_API_KEY") and env.get("WANDB_MODE") not in {"offline", "disabled"}:
        problems.append(
            Problem("env WANDB_API_KEY", "W&B is enabled but the key is not in the environment")
        )
    return problems


def write_config(job: MopdJob) -> None:
    """Write the resolved config the command reads (no secrets: a dry run writes it too)."""
    job.resolved_config.parent.mkdir(parents=True, exist_ok=True)
    job.resolved_config.write_text(job.config_json + "\n")


def write_job_files(job: MopdJob) -> None:
    """Write the resolved config and the runtime env (mode 0600: it may hold secrets)."""
    write_config(job)
    job.metrics_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(job.runtime_env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(job.runtime_env, fh, indent=2, sort_keys=True)
    os.chmod(job.runtime_env_file, 0o600)  # an existing file keeps its mode under O_CREAT


def submit_argv(job: MopdJob, address: str) -> list[str]:
    """``ray job submit`` for the job; the runtime env travels as a file, not as argv."""
    return [
        "ray",
        "job",
        "submit",
        "--address",
        address,
        "--submission-id",
        job.submission_id,
        "--runtime-env",
        str(job.runtime_env_file),
        "--no-wait",
        "--",
        *job.argv,
    ]


SLIME_SPELLINGS = ClusterLayout.SLIME_SPELLINGS
"""slime's (Megatron's) own spellings of the settings the launcher takes under shorter names."""
_ENV_OF = MopdRunSettings.ENV
_REQUIRED = ("mopd_config", "output_dir")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_NONE_MEANS: Mapping[str, object] = {"mopd_topk": DEFAULT_MOPD_TOPK}
"""Fields whose None stands for a value: their help shows that value as the default."""


def _field_help(name: str) -> str:
    """The field's docstring as plain help text, with its default and its variable."""
    info = MopdRunConfig.model_fields[name]
    shown = _NONE_MEANS.get(name, info.default)
    return field_help(info, env=_ENV_OF.get(name), default=shown)


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m dressage.launch.slime_command",
        description="Validate a MOPD run (config, options, checkpoints) and print, exec or "
        "submit its slime command line. Exit 1 listing every problem.",
        epilog="Flags after -- go to slime as they are. Keys are read from the environment, "
        "never from a flag.",
    )
    for name, info in MopdRunConfig.model_fields.items():
        if name == "extra_args":
            continue
        flags = [_flag(name)] + ([SLIME_SPELLINGS[name]] if name in SLIME_SPELLINGS else [])
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _field_help(name)}
        if info.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        if name in _REQUIRED:
            kwargs["required"] = not environ.get(_ENV_OF[name], "")
            kwargs["metavar"] = "PATH"
        if name == "mopd_objective":
            kwargs["choices"] = MOPD_OBJECTIVES
        parser.add_argument(*flags, **kwargs)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_const",
        dest="mode",
        const="print",
        help="write the resolved config and print the command (the default)",
    )
    mode.add_argument(
        "--exec", action="store_const", dest="mode", const="exec", help="run the command here"
    )
    mode.add_argument(
        "--submit",
        action="store_const",
        dest="mode",
        const="submit",
        help="submit the command as a Ray job",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray dashboard of --submit (default: $RAY_ADDRESS, else "
        f"{RaySubmitSettings.model_fields['address'].default})",
    )
    return parser


def _unknown_flag_error(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> None:
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    flag = next((u.split("=", 1)[0] for u in unknown if u.startswith("-")), unknown[0])
    parser.error(
        f"unrecognized option {flag}{did_you_mean(flag, known)}; slime's own flags go after --"
    )


def readable(argv: Sequence[str]) -> str:
    """The command as a shell line, one flag and its values a line."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return " \\\n    ".join(" ".join(line) for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = _parser(os.environ)
    ns, unknown = parser.parse_known_args(ours)
    if unknown:
        _unknown_flag_error(parser, unknown)
    flags = {k: v for k, v in vars(ns).items() if k in MopdRunConfig.model_fields}
    flags["extra_args"] = extra or None
    try:
        run = MopdRunSettings.layered(flags, given_as={name: _flag(name) for name in flags})
    except SettingsError as exc:  # a bad value: one sentence each, naming its flag or variable
        for sentence in exc.sentences:
            print(f"{parser.prog}: {sentence}", file=sys.stderr)
        return 2
    try:
        job = build_mopd_job(run)
    except MopdConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    names = ", ".join(sorted(job.env)) or "none"
    print(f"# forwarded environment (values not shown): {names}", file=sys.stderr)
    if (ns.mode or "print") == "print":
        write_config(job)
        print(f"# wrote {job.resolved_config} (the command reads it)", file=sys.stderr)
        print(readable(job.argv))
        return 0
    write_job_files(job)
    if ns.mode == "exec":
        os.execvpe(job.argv[0], job.argv, {**os.environ, **job.env})
    submit = RaySubmitSettings.layered({"address": ns.address}, given_as={"address": "--address"})
    return subprocess.call(submit_argv(job, submit.address))


if __name__ == "__main__":
    sys.exit(main())
