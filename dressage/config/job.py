"""RUN.json's ``advanced`` options: how an embedded or cluster training job runs.

    options = JobOptions.model_validate(run.advanced)      # run: a TrainRunConfig

:class:`JobOptions` is what a training DAG's Params and ``extra`` put under ``advanced`` (the
rollout mode, sampling, the agent, staleness); its ``cluster`` (:class:`ClusterOptions`) is the
ray backend's slime layout and ports. Both refuse an unknown key (most likely a typo). What the
job makes of them: :mod:`dressage.jobs.job_args` (slime's ``args``) and
:mod:`dressage.jobs.cluster` (slime's command line).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dressage.commands import validation_sentences
from dressage.config.mopd import (
    OBJECTIVE_SLIME_OPTIONS,
    Problem,
    slime_objective_problems,
    slime_options,
)
from dressage.config.run import (
    DEFAULT_MOPD_OBJECTIVE,
    DEFAULT_MOPD_TOPK,
    MOPD_OBJECTIVES,
    ClusterLayout,
    MopdObjective,
    TrainRunConfig,
)

__all__ = [
    "EMBEDDED_MOPD_OPTIONS",
    "DEFAULT_MOPD_OBJECTIVE",
    "DEFAULT_MOPD_TOPK",
    "MOPD_OBJECTIVES",
    "ClusterOptions",
    "JobOptions",
    "MopdObjective",
    "advanced_problems",
    "optimizer_batch",
]


EMBEDDED_MOPD_OPTIONS: dict[str, Any] = {
    "max_response_len": 48,
    "agent_max_turns": 2,
    "mopd_objective": "dense",
    "mopd_forward_kl_weight": 0.5,
    "max_tokens_per_gpu": 8192,
    "max_staleness": 2,
    "max_groups_ahead": 64,
}
"""``advanced`` settings for the embedded default's tiny models (the demo, the MOPD benchmarks
and e2e tests; the defaults below are a real model's): short agent turns, the dense objective
with half its weight on the forward KL, a step's samples trained in one or two packed
micro-batches, groups at most 2 weight versions stale and at most 64 groups (two steps of 32
prompts) generated ahead of training (the ``mopd_`` keys are MOPD-only)."""


class ClusterOptions(ClusterLayout):
    """``advanced.cluster``: the slime layout (:class:`ClusterLayout`) and this job's ports."""

    router_port: int = Field(default=30000, ge=1, le=65535)
    """Where slime is told to serve its SGLang router (on this node)."""
    proxy_port: int = Field(default=18000, ge=1, le=65535)


class JobOptions(BaseModel):
    """``advanced`` in RUN.json; an unknown key is an error (it is most likely a typo)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partial_rollout: bool = True
    """Agents keep running across weight updates (the partial-async rollout); otherwise each
    rollout is one synchronous batch."""
    learning_rate: float = Field(1e-5, gt=0)
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    """Megatron's ``--lr-decay-style``: from ``learning_rate`` down to ``min_lr`` over the run's
    optimizer steps, after ``lr_warmup_iters`` steps of linear warm-up."""
    min_lr: float = Field(0.0, ge=0)
    lr_warmup_iters: int = Field(0, ge=0)
    n_samples_per_prompt: int = Field(4, ge=1)
    """GRPO only (MOPD takes one sample per prompt)."""
    num_steps_per_rollout: int = Field(1, ge=1)
    """GRPO only: optimizer steps on each rollout's samples (slime's
    ``--num-steps-per-rollout``): the batch of prompts x samples per prompt is split into this
    many equal optimizer batches, trained one after another; the policy loss's clipped ratio
    keeps the later steps near the policy that sampled them."""
    max_response_len: int = Field(128, ge=1)
    """Tokens per model call of an agent (``--rollout-max-response-len``)."""
    temperature: float = Field(1.0, gt=0)
    device: str = "auto"
    agent: str | None = None
    """The agent (``DRESSAGE_AGENT`` syntax); default the dispatch's (``tool_user``)."""
    agent_max_turns: int | None = Field(None, ge=1)
    agent_timeout_s: float | None = Field(None, gt=0)
    max_staleness: int | None = Field(None, ge=0)
    """Drop (or mask) groups older than this many weight versions (partial rollout)."""
    stale_policy: Literal["drop", "mask"] = "drop"
    groups_in_flight: int | None = Field(None, ge=1)
    """Groups the background rollout keeps generating (default 2 x rollout_batch_size)."""
    max_groups_ahead: int | None = Field(None, ge=1)
    """Groups the background rollout may hold ahead of training, generating or finished and not
    yet trained; at that many it waits (unset: it never idles, as slime's worker; groups that
    grow too old are then generated only for ``max_staleness`` to drop them)."""
    kl_loss_coef: float = Field(0.0, ge=0)
    """GRPO only: the weight of a KL term to the reference, the student as the run starts
    (slime's ``--use-kl-loss --kl-loss-coef``); 0: no term and no reference is kept."""
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "low_var_kl"
    """The per-token KL estimator of that term (slime's ``--kl-loss-type``)."""
    entropy_coef: float = Field(0.0, ge=0)
    """GRPO only: the weight of an entropy bonus (slime's ``--entropy-coef``)."""
    dynamic_sampling_filter: str | None = None
    """GRPO only: slime's ``--dynamic-sampling-filter-path``, a dotted function
    that keeps or drops each finished group (``dressage.rollout.filters.nonzero_reward_std``
    drops groups whose samples all got the same reward: DAPO's dynamic sampling)."""
    mopd_advantage_clip: float | None = Field(None, gt=0)
    mopd_objective: MopdObjective = DEFAULT_MOPD_OBJECTIVE
    """``dense``: the reverse KL to the teacher over the whole vocabulary, embedded backend only
    (the ray backend refuses it: the teacher's whole log-softmax at every response token);
    ``topk``: the KL over the teacher's top-K tokens, the sampled one and a tail bucket, both
    backends."""
    mopd_topk: int | None = Field(None, ge=1)
    """``topk`` only: K, the teacher's most likely tokens kept a position; None:
    ``DEFAULT_MOPD_TOPK``."""
    mopd_forward_kl_weight: float = Field(0.0, ge=0, le=1)
    """``dense`` and ``topk``: this share of the per-token loss is the forward KL (teacher to
    student), the rest the reverse KL. The reverse KL cannot unlearn a token the student is sure
    of and the teacher rules out (its gradient vanishes there); the forward KL can."""
    max_tokens_per_gpu: int | None = Field(None, ge=1)
    """Dynamic micro-batching for the embedded trainer (slime's ``--use-dynamic-batch-size
    --max-tokens-per-gpu``): each optimizer step's samples packed into micro-batches of at most
    this many tokens; None: slime's default, one sample per micro-batch. The ray backend reads
    ``cluster.max_tokens_per_gpu``."""
    shuffle: bool = False
    eval_interval: int | None = Field(1, ge=1)
    """Steps between held-out accuracy passes (slime's ``--eval-interval``; the embedded job,
    when the datasets have ``eval_path`` rows); None: only before and after the run."""
    save_interval: int = Field(10, ge=1)
    """Steps between checkpoints, and one after the last (slime's ``--save-interval``), in
    ``output_dir/checkpoints/``; rerunning the job on the same ``output_dir`` resumes from the
    newest (the embedded backend; slime's ``--load`` on both of the ray backend's commands)."""
    continue_from: str | None = None
    """A checkpoint of an earlier run (its ``checkpoints/`` folder, one ``iter_XXXXXXX`` folder
    in it, or a ``file://`` URL of either) to start this run from: its student, AdamW's state
    and its data position (the prompts it had handed out but not trained come first); this
    run's own steps, schedule and metrics start at 0; a checkpoint of this run's own (a rerun)
    takes precedence. On the ray backend it is a slime run's checkpoint and slime's rules apply:
    the student's weights and the data position, without the optimizer's state
    (:mod:`dressage.slime.continue_from`). The training DAGs set it from ``continue_from``."""
    cluster: ClusterOptions = ClusterOptions()
    """The ray backend's parallelism, GPUs, W&B and further slime flags."""

    GRPO_ONLY: ClassVar[tuple[str, ...]] = (
        "kl_loss_coef",
        "entropy_coef",
        "dynamic_sampling_filter",
    )
    """Options MOPD's objective has no place for: a KL-to-reference or entropy term, a reward
    filter (see :meth:`objective_problems`)."""

    def objective_problems(self, objective: str) -> list[str]:
        """Options set here that the run's ``objective`` refuses (MOPD: the GRPO-only terms)."""
        if objective != "mopd":
            return []
        problems = [
            f"advanced.{name} {getattr(self, name)} is GRPO-only: MOPD's loss is the distance to "
            "its teachers, with no reward-based filter, KL-to-reference or entropy term"
            for name in self.GRPO_ONLY
            if getattr(self, name)
        ]
        if self.num_steps_per_rollout != 1:
            problems.append(
                f"advanced.num_steps_per_rollout {self.num_steps_per_rollout} is GRPO-only: a "
                "MOPD rollout trains in one optimizer step (its slime launcher checks "
                "--global-batch-size against --rollout-batch-size)"
            )
        return problems

    def optimizer_batch_size(self, *, objective: str, rollout_batch_size: int) -> int:
        """slime's ``global_batch_size``: a rollout's trajectories (prompts x samples per prompt;
        MOPD takes one) over ``num_steps_per_rollout``; a ValueError when it does not divide
        them."""
        rollouts = rollout_batch_size * (1 if objective == "mopd" else self.n_samples_per_prompt)
        return optimizer_batch(rollouts, self.num_steps_per_rollout)

    @model_validator(mode="after")
    def _options_of_the_objective(self) -> JobOptions:
        problems = []
        if self.mopd_forward_kl_weight and self.mopd_objective == "sampled":
            problems.append(
                f"mopd_forward_kl_weight {self.mopd_forward_kl_weight} needs mopd_objective "
                "'dense' or 'topk' (got 'sampled'): the sampled objective has no teacher "
                "distribution to take a forward KL against"
            )
        if self.mopd_topk is not None and self.mopd_objective != "topk":
            problems.append(
                f"mopd_topk {self.mopd_topk} needs mopd_objective 'topk' (got "
                f"{self.mopd_objective!r}): only the top-k objective keeps a teacher's K most "
                "likely tokens"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def optimizer_batch(rollouts: int, steps: int) -> int:
    """slime's ``global_batch_size`` for ``rollouts`` trajectories a rollout trained in ``steps``
    optimizer steps; a ValueError when ``steps`` does not divide them."""
    if rollouts % steps:
        raise ValueError(
            f"advanced.num_steps_per_rollout {steps} does not divide a rollout's {rollouts} "
            "trajectories (prompts per step x samples per prompt) into equal optimizer batches"
        )
    return rollouts // steps


def advanced_problems(run: TrainRunConfig) -> list[str]:
    """Why ``run.advanced`` cannot drive ``run``'s job, one sentence each ([] when it can): an
    unknown key or a bad value, an option the objective refuses, steps per rollout that do not
    divide the rollout, and on the ray backend what slime's MOPD launch refuses of the MOPD
    objective (``dense``; ``topk`` with ``--allgather-cp`` or ``--rollout-top-p`` below 1 in
    ``cluster.extra_args``). The job refuses such a run before anything starts; a training
    DAG's first task, before anything is launched."""
    try:
        options = JobOptions.model_validate(run.advanced)
    except ValidationError as exc:  # one sentence each, "did you mean" for a misspelled key
        return validation_sentences(
            exc,
            JobOptions,
            name=lambda loc: ".".join(["advanced", *(str(part) for part in loc)]),
        )
    problems = options.objective_problems(run.objective)
    try:
        options.optimizer_batch_size(
            objective=run.objective, rollout_batch_size=run.rollout_batch_size
        )
    except ValueError as exc:
        problems.append(str(exc))
    if run.backend == "ray" and run.objective == "mopd":
        problems += [problem.message for problem in _slime_objective_problems(options)]
    return problems


def _slime_objective_problems(options: JobOptions) -> list[Problem]:
    """What slime's MOPD launch would refuse of the objective: ``dense``, and ``topk`` beside
    slime flags in ``cluster.extra_args`` it cannot run with (``--allgather-cp``, top-p)."""
    args = SimpleNamespace(
        mopd_objective=options.mopd_objective,
        mopd_topk=options.mopd_topk,
        mopd_forward_kl_weight=options.mopd_forward_kl_weight,
        **slime_options(options.cluster.extra_args, OBJECTIVE_SLIME_OPTIONS),
    )
    return slime_objective_problems(args)
