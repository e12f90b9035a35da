"""The typed settings of a training run: a MOPD launch of slime, and an embedded job's RUN.json.

    MopdRunConfig.model_validate(params)                       # Airflow Params, JSON
    MopdRunSettings.layered(flags, given_as=flag_names)        # flags over TP_SIZE, ... (below)
    TrainRunConfig.model_validate_json(Path("RUN.json").read_text())

:class:`MopdRunConfig` holds only what a launch decides (parallelism, batch sizes, seeds,
checkpoints, W&B); the teachers and datasets live in the MOPD config it names.
:class:`TrainRunConfig` is RUN.json, what one training job does (its command and outputs:
:mod:`dressage.launch.train_job`; its ``advanced`` options: :mod:`dressage.config.job`).
:class:`MopdRunSettings` is the launcher's: a :class:`MopdRunConfig` layered as every setting is
(:mod:`dressage.config.layered`), a flag over its variable over the field's default, an empty
variable unset. The variables keep the names of slime's launch scripts (``TP_SIZE``,
``NUM_GPUS``, ... in ``MopdRunSettings.ENV``; ``dressage env`` lists them). Credentials never
live here: W&B and the config's ``runtime_env_keys`` are read from the environment and forwarded
through the Ray runtime environment, never put on a command line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from dressage.config.layered import LayeredSettings
from dressage.config.mopd_path import MOPD_CONFIG_ENV, MOPD_CONFIG_OLD_ENV

__all__ = [
    "DEFAULT_MOPD_OBJECTIVE",
    "DEFAULT_MOPD_TOPK",
    "MOPD_OBJECTIVES",
    "ClusterLayout",
    "MopdObjective",
    "MopdRunConfig",
    "MopdRunSettings",
    "RaySubmitSettings",
    "TrainRunConfig",
]

MopdObjective = Literal["sampled", "dense", "topk"]
"""``--mopd-objective``: the sampled-token loss; the dense reverse KL over the vocabulary
(:mod:`dressage.training.mopd_dense`, embedded trainer only); or the KL over the teacher's
top-K support and a tail bucket (:mod:`dressage.training.mopd_topk`, both backends)."""
MOPD_OBJECTIVES: tuple[MopdObjective, ...] = get_args(MopdObjective)
DEFAULT_MOPD_OBJECTIVE: MopdObjective = "topk"
"""What a MOPD job and ``dressage.training.mopd_train`` run unless told otherwise: the top-k
objective, the one that moves skills and runs on both backends (README, "MOPD objectives";
the embedded demo sets ``dense``, ``EMBEDDED_MOPD_OPTIONS``)."""
DEFAULT_MOPD_TOPK = 16
"""K when ``--mopd-topk`` is not given (docs/mopd_objectives.md says why)."""


class ClusterLayout(BaseModel):
    """Where and how slime runs on the cluster: parallelism, GPUs, W&B, further flags."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    SLIME_SPELLINGS: ClassVar[Mapping[str, str]] = {
        "tp_size": "--tensor-model-parallel-size",
        "cp_size": "--context-parallel-size",
        "pp_size": "--pipeline-model-parallel-size",
    }
    """slime's (Megatron's) own spellings of the fields it names otherwise: the launcher takes
    them as flags too, and a key spelled so is told the field's name
    (:func:`dressage.commands.error_message`)."""

    tp_size: int = Field(default=1, ge=1)
    """Tensor parallel size (slime's --tensor-model-parallel-size)."""
    cp_size: int = Field(default=1, ge=1)
    """Context parallel size (slime's --context-parallel-size)."""
    pp_size: int = Field(default=1, ge=1)
    """Pipeline parallel size (slime's --pipeline-model-parallel-size)."""
    actor_num_nodes: int = Field(default=1, ge=1)
    """Nodes of the training actors."""
    actor_num_gpus_per_node: int = Field(default=8, ge=1)
    """GPUs per node of the training actors."""
    colocate: bool = True
    """Trainer and rollout engines share the GPUs (the sync recipe)."""
    rollout_num_gpus: int | None = Field(default=None, ge=1)
    """Engine GPUs when not colocated."""
    rollout_num_gpus_per_engine: int = Field(default=1, ge=1)
    """GPUs of each SGLang engine."""

    max_tokens_per_gpu: int | None = Field(default=None, ge=1)
    """Dynamic micro-batching budget; None keeps slime's static micro-batches."""

    use_wandb: bool = False
    """Log to Weights & Biases (WANDB_API_KEY from the environment, never a flag)."""
    wandb_project: str | None = None
    """The W&B project; needed with --use-wandb."""
    wandb_group: str | None = None
    """The W&B group."""

    python: str = "python3"
    """Interpreter of the training command on the cluster (the slime image's)."""
    extra_args: list[str] = Field(default_factory=list)
    """More slime/Megatron flags (model architecture, optimizer); objective-owned flags are
    refused."""


class MopdRunConfig(ClusterLayout):
    """What one MOPD launch of slime decides; the teachers and datasets are its config's."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mopd_config: str = Field(min_length=1)
    """The MOPD JSON (teachers, datasets, reward modules)."""
    output_dir: str = Field(min_length=1)
    """Run artifacts: resolved config, runtime env, metrics/, checkpoints/ by default."""

    hf_checkpoint: str | None = None
    """Student HF folder; default: the config's ``student.hf_checkpoint``."""
    ref_load: str | None = None
    """Student torch_dist folder; default: the config's ``student.ref_load``."""
    ref_ckpt_step: int | None = Field(default=None, ge=0)
    """Iteration of --ref-load to start from; default: the config's ``student.ckpt_step``."""
    load: str | None = None
    """Resume folder; default ``<output_dir>/checkpoints``."""
    save: str | None = None
    """Checkpoint folder; default ``<output_dir>/checkpoints``."""
    save_interval: int = Field(default=10, ge=1)
    """Rollouts between checkpoints (the training job's ``advanced.save_interval`` too)."""

    num_rollout: int = Field(default=100, ge=1)
    """Rollouts to train, one optimizer step each (MOPD's steps)."""
    rollout_batch_size: int = Field(default=32, ge=1)
    """Prompts a rollout."""
    n_samples_per_prompt: int = Field(default=1, ge=1)
    """MOPD takes 1; more is refused by validation, naming the option."""
    global_batch_size: int | None = Field(default=None, ge=1)
    """Default: rollout_batch_size x n_samples_per_prompt (one step per rollout)."""
    rollout_max_response_len: int = Field(default=8192, ge=1)
    """Most new tokens of one model call."""
    rollout_temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature of the rollout."""

    seed: int = 1234
    """Training seed (slime's --seed)."""
    rollout_seed: int = 42
    """Sampling seed (slime's --rollout-seed)."""
    mopd_advantage_clip: float | None = Field(default=None, gt=0)
    """``--mopd-advantage-clip`` c of the sampled objective; None: the driver's default (5)."""
    mopd_objective: MopdObjective = DEFAULT_MOPD_OBJECTIVE
    """``--mopd-objective``; ``dense`` is refused here (embedded trainer only)."""
    mopd_topk: int | None = None
    """``--mopd-topk`` K of the ``topk`` objective: at least 1, ``topk`` only (checked with the
    objective, :func:`dressage.config.mopd.slime_objective_problems`) and within the student's
    vocabulary, each refusal naming the flag. Unset, K is the default of 16."""
    mopd_forward_kl_weight: float = 0.0
    """``--mopd-forward-kl-weight``: the forward KL's share of ``topk``'s per-token loss, in
    [0, 1] (checked with the objective)."""

    check_imports: bool = True
    """Import hooks, generate functions and reward modules here before launching."""


class MopdRunSettings(LayeredSettings, MopdRunConfig):
    """The launcher's :class:`MopdRunConfig`: its flags over the variables of ``ENV`` over the
    fields' defaults (a field without a variable is a flag only)."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        case_sensitive=True,
        env_ignore_empty=True,
    )
    ENV: ClassVar[Mapping[str, str]] = {
        "mopd_config": MOPD_CONFIG_ENV,
        "output_dir": "OUTPUT_DIR",
        "hf_checkpoint": "HF_CHECKPOINT",
        "ref_load": "REF_LOAD",
        "tp_size": "TP_SIZE",
        "cp_size": "CP_SIZE",
        "pp_size": "PP_SIZE",
        "actor_num_nodes": "NUM_NODES",
        "actor_num_gpus_per_node": "NUM_GPUS",
        "rollout_batch_size": "ROLLOUT_BATCH_SIZE",
        "n_samples_per_prompt": "N_SAMPLES_PER_PROMPT",
        "global_batch_size": "GLOBAL_BATCH_SIZE",
        "num_rollout": "NUM_ROLLOUT",
        "max_tokens_per_gpu": "MAX_TOKENS_PER_GPU",
        "seed": "SEED",
        "rollout_seed": "ROLLOUT_SEED",
        "use_wandb": "USE_WANDB",
        "wandb_project": "WANDB_PROJECT",
        "wandb_group": "WANDB_GROUP",
    }
    """Field -> the variable of slime's launch scripts that sets it."""
    RENAMED: ClassVar[Mapping[str, str]] = {"mopd_config": MOPD_CONFIG_OLD_ENV}
    WHAT: ClassVar[str] = "MOPD launch settings"


class RaySubmitSettings(LayeredSettings):
    """Where the launcher's ``--submit`` sends the job: ``--address`` over ``RAY_ADDRESS`` (Ray's
    own variable) over the local dashboard."""

    ENV: ClassVar[Mapping[str, str]] = {"address": "RAY_ADDRESS"}
    WHAT: ClassVar[str] = "Ray job submission settings"

    address: str = "http://127.0.0.1:8265"


class TrainRunConfig(BaseModel):
    """RUN.json: what one training job does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Literal["mopd", "grpo"]
    mopd_config: str
    """The MOPD JSON: teachers (MOPD) and the datasets and reward modules (both objectives)."""
    student: str
    """Student checkpoint: an HF folder or a ``tiny:seed=N`` spec."""
    engine_url: str | None
    proxy_url: str | None
    """None on the ray backend: the job starts its own engines and proxy on the cluster."""
    output_dir: str
    num_steps: int = Field(ge=1)
    seed: int
    rollout_batch_size: int = Field(ge=1)
    backend: Literal["embedded", "ray"] = "embedded"
    """Written only when "ray": the job then trains on the cluster it runs in."""
    advanced: dict[str, Any] = Field(default_factory=dict)
    """Passed through untouched (learning_rate, partial_rollout, ...)."""

    def to_json(self) -> str:
        exclude = {"backend"} if self.backend == "embedded" else set()
        return json.dumps(self.model_dump(mode="json", exclude=exclude), indent=2, sort_keys=True)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path
