"""The MOPD config: teachers, datasets and reward modules, validated once and failing closed.

``DRESSAGE_MOPD_CONFIG`` points at a JSON file of this shape::

    {
      "student":  {"hf_checkpoint": "/ckpt/Qwen3.5-4B", "ref_load": "/ckpt/Qwen3.5-4B_torch_dist"},
      "teachers": {"alfworld": {"load": "/ckpt/alfworld_torch_dist", "ckpt_step": 400,
                                "tokenizer": "/ckpt/alfworld_hf"}},
      "datasets": [{"name": "alfworld", "path": "data/alfworld.jsonl", "teacher_id": "alfworld",
                    "weight": 1.0, "agent_mode": "blackbox", "generate_function_path": null}],
      "reward_modules": ["dressage.reward.tasks"],
      "runtime_env_keys": ["OPENAI_API_KEY"]
    }

Every dataset names its teacher: there is no default teacher, by design, so a sample can never
be distilled from a teacher nobody chose. Path values may use ``${VAR}`` (an unset variable is
an error) and are resolved against the config file's folder when relative; ``tiny:seed=1`` (also
``vocab=qwen3``, ``hidden_size=32``, ...) names a tiny model from :mod:`dressage.tiny`, and
``tiny-sft:task=calculator[,seed=0,steps=32,...]`` a tiny model fine-tuned on a task
(:mod:`dressage.tiny.teachers`). This module only reads and checks them;
:func:`dressage.tiny.checkpoints.resolve_checkpoint` turns them into folders and never trains.

Check a config (routes, rewards, checkpoints; the one check every caller runs)::

    dressage mopd check configs/mopd/embedded.json
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dressage.config.mopd_files import pydantic_problems, resolve_paths
from dressage.config.mopd_path import MOPD_CONFIG_ENV, mopd_config_path
from dressage.config.problems import MopdConfigError, MopdReport, Problem
from dressage.slime.mopd_args import mopd_args

__all__ = [
    "MOPD_HOOKS",
    "OBJECTIVE_SLIME_OPTIONS",
    "DatasetSpec",
    "MopdConfig",
    "MopdConfigError",
    "MopdReport",
    "Problem",
    "StudentSpec",
    "TeacherSpec",
    "UNSUPPORTED_SLIME_OPTIONS",
    "load_mopd_config",
    "mopd_args_defaults",
    "slime_objective_problems",
    "slime_options",
    "validate_mopd_run",
]

# slime args attribute -> the dressage hook it must name (docs/architecture.md ★ paths). The
# first four carry the objective and the teacher ids; a run that swaps any of them is not MOPD
# any more.
MOPD_HOOKS: Mapping[str, str] = {
    "custom_advantage_function_path": "dressage.training.mopd_loss.compute_mopd_advantages",
    "custom_loss_function_path": "dressage.training.mopd_loss.mopd_policy_loss",
    "custom_convert_samples_to_train_data_path": (
        "dressage.rollout.convert_samples.convert_samples_to_train_data"
    ),
    "data_source_path": "dressage.rollout.data_source.MopdDataSource",
    "custom_reward_post_process_path": "dressage.training.reward_post_process.reward_post_process",
    "custom_rm_path": "dressage.reward.custom_rm.custom_rm",
    "custom_generate_function_path": "dressage.rollout.generate.blackbox_dispatch.generate",
}
_REQUIRED_HOOKS = (
    "custom_advantage_function_path",
    "custom_loss_function_path",
    "custom_convert_samples_to_train_data_path",
    "data_source_path",
)
# slime awaits these (docs/slime.md §2), so a plain function fails only mid-rollout.
_COROUTINE_HOOKS = {"custom_rm_path", "custom_generate_function_path"}

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TeacherSpec(_Strict):
    load: str = Field(min_length=1)
    """Checkpoint folder: Megatron torch_dist (cluster) or Hugging Face layout (embedded)."""
    ckpt_step: int | None = Field(default=None, ge=0)
    """Iteration to load from a torch_dist folder; None = latest_checkpointed_iteration.txt."""
    tokenizer: str | None = None
    """HF folder with the tokenizer, when ``load`` is torch_dist and has no tokenizer files."""


class StudentSpec(_Strict):
    hf_checkpoint: str = Field(min_length=1)
    """HF folder: tokenizer, config, and the weights the rollout engine starts from."""
    ref_load: str | None = None
    """Megatron torch_dist folder the actor starts from (slime's ``--ref-load``)."""
    ckpt_step: int | None = Field(default=None, ge=0)


class DatasetOptions(_Strict):
    """A dataset's optional settings, read by dressage.rollout.data_source; shared by the MOPD
    config's :class:`DatasetSpec` and the data source's ``PromptDataset``."""

    generate_function_path: str | None = None
    task: str | None = None
    """The reward task of the rows (a name in dressage.reward.registry)."""
    input_key: str | None = None
    """Per-dataset overrides of slime's --input-key, --label-key and --metadata-key."""
    label_key: str | None = None
    metadata_key: str | None = None
    eval_path: str | None = None
    """Held-out rows of the same task, never trained on: the embedded job measures the exact
    reverse KL to the dataset's teacher on them after every step."""


class DatasetSpec(DatasetOptions):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    teacher_id: str
    weight: float
    agent_mode: Literal["blackbox", "whitebox"]


class MopdConfig(_Strict):
    teachers: dict[str, TeacherSpec]
    datasets: list[DatasetSpec]
    reward_modules: list[str] = Field(default_factory=list)
    runtime_env_keys: list[str] = Field(default_factory=list)
    student: StudentSpec | None = None

    def materialize(self, resolve: Callable[[str], Path]) -> MopdConfig:
        """A copy whose checkpoints are replaced by ``resolve(value)``: the folders that
        ``tiny:``/``tiny-sft:`` specs name (:func:`dressage.tiny.checkpoints.resolve_checkpoint`,
        which never trains and raises for a teacher that is not built yet).
        """

        def real(value: str | None) -> str | None:
            return None if value is None else str(resolve(value))

        teachers = {
            tid: t.model_copy(update={"load": real(t.load), "tokenizer": real(t.tokenizer)})
            for tid, t in self.teachers.items()
        }
        student = self.student
        if student is not None:
            student = student.model_copy(
                update={
                    "hf_checkpoint": real(student.hf_checkpoint),
                    "ref_load": real(student.ref_load),
                }
            )
        return self.model_copy(update={"teachers": teachers, "student": student})

    def built_specs(self) -> list[str]:
        """Every ``tiny:``/``tiny-sft:`` spec the student and the teachers name, in order, once
        each: what ``dressage assets --config`` and the DAGs' ``prepare`` task build."""
        named = [self.student.hf_checkpoint, self.student.ref_load] if self.student else []
        for teacher in self.teachers.values():
            named += [teacher.load, teacher.tokenizer]
        specs = [v for v in named if v is not None and v.startswith(("tiny:", "tiny-sft:"))]
        return list(dict.fromkeys(specs))


# ---------------------------------------------------------------------------------------------
# Loading


_LOADED: dict[tuple[str, bytes, int], MopdConfig] = {}
"""Configs this process has validated, by (file, content, environment): the environment
because a config's ``${VAR}`` placeholders expand from it."""


def load_mopd_config(path: str | Path | None = None) -> MopdConfig:
    """Read, type-check and path-resolve the config; raise :class:`MopdConfigError` if invalid.

    ``path`` (None or "": not given) over ``$DRESSAGE_MOPD_CONFIG``
    (:func:`~dressage.config.mopd_path.mopd_config_path`). A file is parsed and validated
    once per process: a later call for the same file with the same content returns the same
    (frozen) config; a changed file (or environment, which its ``${VAR}`` placeholders read) is
    validated again.
    """
    raw_path = mopd_config_path(path, given_as="path")
    if not raw_path:
        problem = Problem(MOPD_CONFIG_ENV, "no MOPD config path given or set")
        raise MopdConfigError([problem], source="MOPD config")
    source = Path(raw_path).expanduser().resolve()
    try:
        environment = hash(tuple(sorted(os.environ.items())))
        key: tuple[str, bytes, int] | None = (str(source), source.read_bytes(), environment)
    except OSError:
        key = None  # _load says why in one sentence
    if key is not None and key in _LOADED:
        return _LOADED[key]
    config = _load(source)
    if key is not None:
        _LOADED[key] = config
    return config


def _load(source: Path) -> MopdConfig:
    data = _read_json(source)
    try:
        config = MopdConfig.model_validate(data)
    except ValidationError as exc:
        found = pydantic_problems(exc, data, MopdConfig)
        raise MopdConfigError(found, source=str(source)) from exc
    problems: list[Problem] = []
    config = resolve_paths(config, source.parent, problems)
    problems += _config_problems(config, check_paths=False)
    if problems:
        raise MopdConfigError(problems, source=str(source))
    return config


def _read_json(source: Path) -> dict[str, Any]:
    """The file's JSON object; a missing, empty or malformed file is one sentence saying so."""

    def fail(message: str) -> MopdConfigError:
        return MopdConfigError([Problem(str(source), message)], source="MOPD config")

    try:
        text = source.read_text()
    except FileNotFoundError:
        raise fail("no such file") from None
    except OSError as exc:
        raise fail(f"cannot be read: {exc.strerror or exc}") from None
    if not text.strip():
        raise fail("the file is empty; a MOPD config is a JSON object with teachers and datasets")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(
            f"is not valid JSON: {exc.msg.lower()} at line {exc.lineno}, column {exc.colno}"
        ) from None
    if not isinstance(data, dict):
        kind = {"list": "a list", "str": "a string"}.get(type(data).__name__, json.dumps(data))
        raise fail(f"must hold a JSON object with teachers and datasets, got {kind}")
    return data


# ---------------------------------------------------------------------------------------------
# Validation


def _config_problems(config: MopdConfig, *, check_paths: bool) -> list[Problem]:
    problems: list[Problem] = []
    if not config.teachers:
        problems.append(Problem("teachers", "no teacher configured"))
    if not config.datasets:
        problems.append(Problem("datasets", "no dataset configured"))
    for tid in config.teachers:
        if not tid.strip() or tid != tid.strip():
            problems.append(Problem(f"teacher {tid!r}", "an id must be non-empty, no padding"))
    seen: set[str] = set()
    known = ", ".join(sorted(config.teachers)) or "none"
    for ds in config.datasets:
        subject = f"dataset {ds.name!r}"
        if ds.name in seen:
            problems.append(Problem(subject, "the name is used by more than one dataset"))
        seen.add(ds.name)
        if ds.teacher_id not in config.teachers:
            problems.append(
                Problem(
                    subject,
                    f"teacher_id {ds.teacher_id!r} is not a teacher of this config (known: "
                    f"{known}); there is no default teacher",
                )
            )
        if not (math.isfinite(ds.weight) and ds.weight > 0):
            finite = "" if math.isfinite(ds.weight) else " and finite"
            problems.append(Problem(subject, f"weight must be > 0{finite}, got {ds.weight}"))
        if ds.agent_mode == "whitebox" and not ds.generate_function_path:
            problems.append(Problem(subject, "a whitebox dataset needs generate_function_path"))
        if ds.generate_function_path and not _DOTTED.match(ds.generate_function_path):
            problems.append(
                Problem(
                    subject,
                    f"generate_function_path {ds.generate_function_path!r} must be "
                    "module.attribute (slime splits on the last dot; 'file.py:fn' is unsupported)",
                )
            )
        if check_paths and "://" not in ds.path and not Path(ds.path).is_file():
            problems.append(Problem(subject, f"path {ds.path} does not exist"))
        if check_paths and ds.eval_path and not Path(ds.eval_path).is_file():
            problems.append(Problem(subject, f"eval_path {ds.eval_path} does not exist"))
    for module in config.reward_modules:
        if not _DOTTED.match(module) and not re.match(r"^[A-Za-z_]\w*$", module):
            problems.append(Problem(f"reward module {module!r}", "not a dotted module path"))
    for key in config.runtime_env_keys:
        if not _ENV_NAME.match(key):
            problems.append(Problem(f"runtime_env_keys {key!r}", "not an environment name"))
    return problems


# slime options the project's rollout path cannot honour: refused before anything starts.
UNSUPPORTED_SLIME_OPTIONS: dict[str, tuple[str, str]] = {
    "use_rollout_routing_replay": (
        "--use-rollout-routing-replay",
        "rollout routing replay (R3) needs each token's routed experts from the engine; the "
        "recording proxy does not record them, so the trainer would replay nothing "
        "(--use-routing-replay, which records routing in the training forward, is supported)",
    ),
}


def unsupported_slime_options(args: Any) -> list[Problem]:
    """Problems for the slime options set in ``args`` that no dressage path can honour."""
    return [
        Problem(f"option {flag}", why)
        for attr, (flag, why) in UNSUPPORTED_SLIME_OPTIONS.items()
        if getattr(args, attr, False)
    ]


def _objective_problems(args: Any) -> list[Problem]:
    """Options that contradict A_t = clip(log π_T − log π_old, ±c), L = −mean(A_t · log π)."""

    def opt(name: str, default: Any) -> Any:
        value = getattr(args, name, default)
        return default if value is None else value

    problems: list[Problem] = []

    def bad(option: str, message: str) -> None:
        problems.append(Problem(f"option {option}", message))

    n = int(opt("n_samples_per_prompt", 1))
    if n > 1:
        bad(
            "--n-samples-per-prompt",
            f"MOPD takes one sample per prompt (the teacher, not a group baseline, gives the "
            f"signal), got {n}",
        )
    if opt("use_kl_loss", False):
        bad("--use-kl-loss", "a KL-to-reference loss term is not part of MOPD")
    if float(opt("kl_loss_coef", 0.0)) != 0.0:
        bad("--kl-loss-coef", f"a KL loss term is not part of MOPD, got {opt('kl_loss_coef', 0)}")
    if float(opt("kl_coef", 0.0)) != 0.0:
        bad("--kl-coef", f"reward KL shaping is not part of MOPD, got {opt('kl_coef', 0.0)}")
    if float(opt("entropy_coef", 0.0)) != 0.0:
        bad("--entropy-coef", f"an entropy term is not part of MOPD, got {opt('entropy_coef', 0)}")
    if opt("rewards_normalization", True):
        bad("--disable-rewards-normalization", "must be set: group reward normalisation is GRPO's")
    if opt("normalize_advantages", False):
        bad("--normalize-advantages", "whitening would rescale the clipped teacher advantage")
    if opt("loss_type", "policy_loss") != "custom_loss":
        bad(
            "--loss-type",
            f"must be custom_loss (PPO ratio losses are not MOPD), got {opt('loss_type', '')!r}",
        )
    for attr in _REQUIRED_HOOKS:
        if opt(attr, None) != MOPD_HOOKS[attr]:
            flag = "--" + attr.replace("_", "-")
            bad(flag, f"must be {MOPD_HOOKS[attr]}, got {opt(attr, None)!r}")
    if opt("use_opd", False):
        bad("--use-opd", "slime's single-teacher OPD shaping would be added on top of MOPD")
    problems += unsupported_slime_options(args)
    if opt("use_critic", False) or opt("advantage_estimator", "") == "ppo":
        bad("--advantage-estimator", "a critic (ppo) is not part of MOPD")
    if not opt("compute_advantages_and_returns", True):
        bad("--disable-compute-advantages-and-returns", "MOPD advantages would never be computed")
    steps = int(opt("num_steps_per_rollout", 1))
    if steps != 1:
        bad("--num-steps-per-rollout", f"MOPD takes one step per rollout, got {steps}")
    gbs, rbs = getattr(args, "global_batch_size", None), getattr(args, "rollout_batch_size", None)
    if gbs is not None and rbs is not None and int(gbs) != int(rbs) * n:
        bad(
            "--global-batch-size",
            f"{gbs} != rollout_batch_size x n_samples_per_prompt = {int(rbs) * n}: more than one "
            "step per rollout",
        )
    return problems


# slime flags a command's extra arguments may carry that decide whether its MOPD objective can
# run: (flag, attribute as slime's parser sets it, argparse action or type).
OBJECTIVE_SLIME_OPTIONS: tuple[tuple[str, str, Any], ...] = (
    ("--allgather-cp", "allgather_cp", "store_true"),
    ("--rollout-top-p", "rollout_top_p", float),
)

_DENSE_ON_SLIME = (
    "--mopd-objective dense is embedded-only: it keeps the teacher's full log-softmax at every "
    "response token, V x 4 bytes a token (about 8 GB a sample of 8k tokens at Qwen3.5's "
    "248,320-entry vocabulary); use --mopd-objective topk, which keeps the teacher's top-K "
    "tokens and a tail (O(K) a token), or the embedded trainer"
)


def slime_options(argv: Sequence[str], options: Sequence[tuple[str, str, Any]]) -> dict[str, Any]:
    """The ``options`` (flag, attribute, action or type) set in ``argv``, by attribute, as
    slime's parser would read them (the last of a repeated flag wins); unknown flags skipped."""
    parser = argparse.ArgumentParser(add_help=False)
    for flag, dest, kind in options:
        if isinstance(kind, str):
            parser.add_argument(flag, dest=dest, action=kind, default=None)
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=None)
    parsed, _ = parser.parse_known_args(list(argv))
    return {k: v for k, v in vars(parsed).items() if v is not None}


def slime_objective_problems(args: Any) -> list[Problem]:
    """What slime's MOPD actor cannot train of the objective in ``args``, one sentence each,
    naming the flags: ``dense`` (embedded-only); ``--mopd-topk`` below 1 or without ``topk``;
    ``--mopd-forward-kl-weight`` outside [0, 1] or with ``sampled``; ``topk`` with
    ``--allgather-cp`` (its support follows slime's zigzag context-parallel layout) or
    ``--rollout-top-p`` below 1 (slime's top-p replay masks the log-probs it is built from).
    ``--mopd-topk`` against the vocabulary is checked with the checkpoints
    (:func:`dressage.training.checkpoints.validate_mopd_checkpoints`).

    ``args`` is read as the hooks read it (:func:`dressage.slime.mopd_args.mopd_args`), so what
    is checked is what runs: an ``args`` without ``mopd_objective`` (slime's parser without the
    MOPD flags) is checked as ``sampled``, the objective the hooks then run, not the project's
    default (``topk``), which only ``dressage.training.mopd_train``'s parser and the launcher,
    always passing ``--mopd-objective``, give."""
    view = mopd_args(args)
    objective, k, b = view.mopd_objective, view.mopd_topk, view.mopd_forward_kl_weight
    top_p = view.rollout_top_p
    problems: list[Problem] = []

    def bad(flag: str, sentence: str) -> None:
        problems.append(Problem(f"option {flag}", sentence))

    if objective == "dense":
        bad("--mopd-objective", _DENSE_ON_SLIME)
    if k is not None and k < 1:
        bad(
            "--mopd-topk",
            f"--mopd-topk {k} is below 1: topk keeps the teacher's K most likely tokens a "
            "position, at least one",
        )
    if k is not None and objective != "topk":
        bad(
            "--mopd-topk",
            f"--mopd-topk {k} needs --mopd-objective topk (got {objective!r}): only the "
            "top-k objective keeps a teacher's K most likely tokens",
        )
    if not 0.0 <= b <= 1.0:
        bad(
            "--mopd-forward-kl-weight",
            f"--mopd-forward-kl-weight {b} is outside [0, 1]: it is the forward KL's share "
            "of each token's loss",
        )
    elif b and objective == "sampled":
        bad(
            "--mopd-forward-kl-weight",
            f"--mopd-forward-kl-weight {b} needs --mopd-objective dense or topk (got "
            "'sampled'): the sampled objective has no teacher distribution to take a "
            "forward KL against",
        )
    if objective == "topk" and view.allgather_cp:
        bad(
            "--allgather-cp",
            "--mopd-objective topk cannot run with --allgather-cp: its teacher support and "
            "loss follow slime's zigzag context-parallel layout, which --allgather-cp replaces "
            "with another; drop --allgather-cp or use --mopd-objective sampled",
        )
    if objective == "topk" and top_p < 1.0:
        bad(
            "--rollout-top-p",
            f"--mopd-objective topk cannot run with --rollout-top-p {top_p} (below 1): "
            "slime's top-p replay masks the log-probs outside the rollout's nucleus, the "
            "log-probs the teacher's top-K support and tail are built from; use "
            "--rollout-top-p 1 or --mopd-objective sampled",
        )
    return problems


def _import_error(path: str, *, coroutine: bool) -> str | None:
    module_name, _, attr = path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # any import-time failure is the evidence the report must carry
        return f"cannot import {path}: {type(exc).__name__}: {exc}"
    if coroutine and not inspect.iscoroutinefunction(target):
        return f"{path} must be an async function (slime awaits it)"
    return None


def _import_problems(config: MopdConfig, args: Any) -> list[Problem]:
    problems: list[Problem] = []
    for ds in config.datasets:
        if ds.generate_function_path and _DOTTED.match(ds.generate_function_path):
            err = _import_error(ds.generate_function_path, coroutine=True)
            if err:
                problems.append(Problem(f"dataset {ds.name!r}", err))
    for module in config.reward_modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # reported with its type and text
            problems.append(Problem(f"reward module {module!r}", f"{type(exc).__name__}: {exc}"))
    for attr in MOPD_HOOKS:
        path = getattr(args, attr, None)
        if isinstance(path, str) and _DOTTED.match(path):
            err = _import_error(path, coroutine=attr in _COROUTINE_HOOKS)
            if err:
                problems.append(Problem(f"option --{attr.replace('_', '-')}", err))
    return problems


def validate_mopd_run(
    config: MopdConfig,
    args: Any,
    *,
    check_imports: bool = True,
    check_paths: bool = True,
    environ: Mapping[str, str] | None = None,
) -> MopdReport:
    """Every reason this config plus these slime options must not train, in one report.

    ``args`` is slime's parsed namespace or anything with the same attribute names; a missing
    attribute takes slime's default. Checkpoints are checked by
    :func:`dressage.training.checkpoints.validate_mopd_checkpoints`.
    """
    env = os.environ if environ is None else environ
    report = MopdReport(problems=_config_problems(config, check_paths=check_paths))
    report.problems += _objective_problems(args)
    if check_imports:
        report.problems += _import_problems(config, args)
    for key in config.runtime_env_keys:
        if _ENV_NAME.match(key) and not env.get(key):
            report.problems.append(
                Problem(f"runtime_env_keys {key!r}", "not set here, so it cannot be forwarded")
            )
    used = {ds.teacher_id for ds in config.datasets}
    for tid in sorted(set(config.teachers) - used):
        report.warnings.append(
            Problem(f"teacher {tid!r}", "no dataset names it; it would only occupy host memory")
        )
    return report


def mopd_args_defaults(**overrides: Any) -> SimpleNamespace:
    """The slime options a MOPD run needs, as an args-like namespace (for checks and tests)."""
    values: dict[str, Any] = {
        "n_samples_per_prompt": 1,
        "loss_type": "custom_loss",
        "rewards_normalization": False,
        "advantage_estimator": "mopd",
        **{attr: MOPD_HOOKS[attr] for attr in _REQUIRED_HOOKS},
    }
    values.update(overrides)
    return SimpleNamespace(**values)
