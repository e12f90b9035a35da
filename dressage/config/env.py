"""Every ``DRESSAGE_*`` environment variable, its type, default and meaning, in one place.

Code reads these through :func:`env_str`, :func:`env_int`, :func:`env_float` and :func:`env_bool`,
which refuse names that are not declared, so a typo fails loudly instead of silently falling
back to a default. The proxy's ``DRESSAGE_PROXY_*`` variables, the trainer's pause client's and
the agent dispatch's are declared from their settings' fields (:mod:`dressage.config.proxy`,
:mod:`~dressage.config.pause_client`, :mod:`~dressage.config.agent_dispatch`, imported with this
package: each default written once, on its field). ``dressage env`` prints the table
(:func:`all_variables`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    doc: str


_DECLARED = [
    EnvVar(
        "DRESSAGE_CACHE_DIR",
        None,
        "Where generated assets (tokenizers, tiny models) are cached. "
        "Default: $XDG_CACHE_HOME/dressage or ~/.cache/dressage.",
    ),
    EnvVar(
        "DRESSAGE_BUILD_DEVICE",
        None,
        "Where the project's own models train when built (a base that does not ship, the tiny "
        "teachers and students): cpu, cuda, cuda:1, ... Default: cuda when torch sees one, else "
        "cpu.",
    ),
    EnvVar("DRESSAGE_PROXY_URL", None, "Base URL of the recording proxy, for rollout code."),
    EnvVar(
        "DRESSAGE_ENGINE_ADMIN_KEY",
        None,
        "Key of the embedded engine's control routes (pause, abort, weight updates); the engine "
        "needs one to start, and the proxy and the training job send it.",
    ),
    EnvVar(
        "DRESSAGE_ENGINE_API_KEY",
        None,
        "Key the embedded engine requires on every route but health (SGLang's --api-key).",
    ),
    EnvVar(
        "DRESSAGE_MOPD_CONFIG",
        None,
        "Path of the MOPD JSON config (teachers, datasets, reward modules): the variable of "
        "--mopd-config.",
    ),
    EnvVar(
        "DRESSAGE_MOPD_TEACHER_CONFIG",
        None,
        "Deprecated spelling of DRESSAGE_MOPD_CONFIG (read when that is unset).",
    ),
    EnvVar(
        "DRESSAGE_MOPD_SCHEDULE",
        None,
        "Schedule of the dressage_mopd DAG: a cron expression or preset (@daily, ...); "
        "unset = triggered runs only. Read by the DAG processor when it parses the DAG.",
    ),
    EnvVar(
        "DRESSAGE_JOB_MODULE",
        "dressage.jobs.train",
        "Module the training DAGs run as `python -m MODULE --run-config RUN.json` "
        "(internal: tests point it at a small contract job).",
    ),
    EnvVar(
        "DRESSAGE_AIRFLOW_HOME",
        None,
        "AIRFLOW_HOME of `make airflow` (scripts/airflow.sh). Default: ./airflow_home.",
    ),
    EnvVar(
        "DRESSAGE_VENV",
        ".venv",
        "The virtual environment `make` and scripts/bootstrap.sh install into and run from.",
    ),
    EnvVar(
        "DRESSAGE_FUZZ_SCALE",
        "1",
        "Example counts of the schema fuzz tests, times this (scripts/chaos.py raises it).",
    ),
    EnvVar(
        "DRESSAGE_RECORDED_SAMPLES",
        None,
        "The GPU tier (tests/real_slime): samples recorded through the proxy on another "
        "machine (`python -m tests.real_slime.gpu_rig record DIR`), where the proxy's packages "
        "are not installed.",
    ),
]

ENV: dict[str, EnvVar] = {v.name: v for v in _DECLARED}


def declare(name: str, default: str | None, doc: str) -> EnvVar:
    """Declare a variable from the module that owns it (kept beside its use, listed here)."""
    if not name.startswith("DRESSAGE_"):
        raise ValueError(f"environment variable {name!r} must start with DRESSAGE_")
    existing = ENV.get(name)
    if existing is not None and (existing.default, existing.doc) != (default, doc):
        raise ValueError(f"{name} declared twice with different defaults or docs")
    var = EnvVar(name, default, doc)
    ENV[name] = var
    return var


def all_variables() -> list[EnvVar]:
    """Every declared variable, by name (the settings modules' included)."""
    import dressage.config.agent_dispatch  # noqa: F401  (declares DRESSAGE_AGENT_*)
    import dressage.config.pause_client  # noqa: F401  (declares DRESSAGE_PROXY_PAUSE_*)
    import dressage.config.proxy  # noqa: F401  (declares the DRESSAGE_PROXY_* variables)

    return sorted(ENV.values(), key=lambda v: v.name)


# Variables read outside the DRESSAGE_* family: scripts, make targets, the Dockerfiles' build
# arguments, libraries' own names.
OTHER_VARIABLES: dict[str, str] = {
    "AIRFLOW_HOME": "Airflow's home: `make demo` sets ./airflow_home (make airflow: "
    "DRESSAGE_AIRFLOW_HOME).",
    "AIRFLOW_PORT": "Port of `make airflow` (scripts/airflow.sh). Default: 8080.",
    "DEMO_ARGS": "Arguments `make demo` passes to `dressage demo` (--steps N, --conf JSON).",
    "DEMO_STEPS": "Default of `dressage demo --steps`. Default: 100.",
    "SLIME_ROOT": "A slime checkout: `make test` then runs the real-slime tier (tests/real_slime).",
    "MEGATRON_LM_ROOT": "A Megatron-LM checkout (its megatron/training): with SLIME_ROOT, on a "
    "GPU, `make test` runs the real-slime tier's GPU tests too.",
    "OPENAI_BASE_URL": "`python -m dressage.agents`: the proxy session's base URL the agent "
    "calls (required).",
    "OPENAI_API_KEY": "`python -m dressage.agents`: the key the agent sends to the proxy.",
    "MASTER_PORT": "torch.distributed's port of a one-GPU Megatron conversion "
    "(dressage.slime.torch_dist). Default: a free port.",
    "MOPD_RECIPE_TOKENIZER": "scripts/research/mopd_recipe.py: the tokenizer it loads. Default: "
    "scripts/research/tok.",
    "SLIME_IMAGE": "Build argument of containers/trainer.Dockerfile: the slime image it builds on.",
    "AIRFLOW_IMAGE": "Build argument of containers/airflow.Dockerfile: the Airflow image it "
    "builds on.",
    "AIRFLOW__CORE__FERNET_KEY": "Airflow's key for what it encrypts at rest; unset, `dressage "
    "demo` keeps one in $AIRFLOW_HOME/.fernet_key.",
    "PYTHON": "The interpreter scripts/bootstrap.sh makes .venv from (default python3.11), and "
    "the one scripts/run_mopd_qwen3.5_sync.sh runs the launcher with.",
    "WITH_TORCH": "Build argument of containers/airflow.Dockerfile (and compose.yaml): 1 installs "
    "CPU torch so that the embedded backend runs in the Airflow containers; 0 leaves it out.",
    "OMP_NUM_THREADS": "Intra-op threads of the engine, proxy and trainer; scripts/demo.sh sets 1.",
    "XDG_CACHE_HOME": "Parent of the asset cache when DRESSAGE_CACHE_DIR is unset.",
    "RAY_ADDRESS": "The Ray dashboard `dressage mopd launch --submit` submits to.",
    "WANDB_API_KEY": "The W&B key a run with --use-wandb forwards to the workers (never a flag).",
    "WANDB_MODE": "W&B's mode; offline or disabled needs no WANDB_API_KEY.",
    "WANDB_RUN_ID": "The W&B run a cluster job logs to; unset, the job keeps one in its save "
    "folder (wandb_run_id.txt), so a resubmitted job continues its run.",
    "WANDB_RESUME": "W&B's resume mode; a cluster job sets allow unless it is set.",
    "MODEL_ARGS": "scripts/run_mopd_qwen3.5_sync.sh: slime's model flags, after --.",
    "DRY_RUN": "scripts/run_mopd_qwen3.5_sync.sh: 1 validates and prints the command.",
    "LAUNCH": "scripts/run_mopd_qwen3.5_sync.sh: exec runs the command here (default: submit).",
    "CHECK_IMPORTS": "scripts/run_mopd_qwen3.5_sync.sh: 0 passes --no-check-imports.",
}


def launcher_variables() -> list[tuple[str, str]]:
    """(name, meaning) of the launcher's variables, which keep slime's launch scripts' names."""
    from dressage.config.run import MopdRunSettings

    return sorted(
        (name, f"The launcher's --{field.replace('_', '-')}.")
        for field, name in MopdRunSettings.ENV.items()
    )


def _raw(name: str) -> str | None:
    try:
        var = ENV[name]
    except KeyError:
        raise KeyError(
            f"{name} is not a declared DRESSAGE_* variable (see dressage.config.env)"
        ) from None
    value = os.environ.get(name)
    return var.default if value is None or value == "" else value


def env_str(name: str) -> str | None:
    return _raw(name)


def env_given(name: str) -> str | None:
    """What the variable is set to, None when unset or empty: its default is not read (a
    cluster job tells "set" from "the proxy's own default")."""
    _raw(name)  # refuses undeclared names
    return os.environ.get(name) or None


def env_secret(name: str) -> str | None:
    """A key: None when unset. Set but empty (what an unset ``$KEY`` expands to in a shell) is an
    error, not "no key": read as unset, it would leave open what the key was meant to close."""
    _raw(name)  # refuses undeclared names
    value = os.environ.get(name)
    if value is not None and not value.strip():
        raise ValueError(
            f"{name} is set but empty: give it a key, or unset it (an empty key is not 'no key')"
        )
    return value


def env_int(name: str) -> int | None:
    raw = _raw(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def env_float(name: str) -> float | None:
    raw = _raw(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str) -> bool:
    raw = (_raw(name) or "0").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use one of {sorted(_TRUE | _FALSE)})")


def cache_dir() -> Path:
    """The asset cache folder (created on demand)."""
    configured = env_str("DRESSAGE_CACHE_DIR")
    if configured:
        path = Path(configured)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "dressage"
    path.mkdir(parents=True, exist_ok=True)
    return path
