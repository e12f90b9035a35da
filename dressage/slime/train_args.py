"""Typed views of the slime flags the trainer, the advantages and the losses read.

slime hands every hook its whole argparse ``Namespace``. Each view here is a frozen dataclass
whose fields are the flags one area reads, with slime's (or Megatron's) default for each; its
reader (``actor_args(args)``, ...) does the ``getattr`` calls once, with the coercions the hooks
have always applied, so a Namespace that lacks a flag reads as slime's default (docs/slime.md).

- :class:`ActorArgs`: the trainer itself: model, device, batching, checkpoints, hook paths, the
  reference and OPD teachers, the driver's switches.
- :class:`OptimizerArgs`: gradient clipping and the learning-rate schedule.
- :class:`AdvantageArgs`: what ``compute_advantages_and_returns`` (and the MOPD advantage hook)
  read.
- :class:`PolicyLossArgs`: what slime's policy loss reads.
- :class:`LogProbArgs`: how log-probs are taken from logits (temperature, chunking, the hook).

A view reads its flags where it is built: callers build it when they need it (``args`` may
change between calls, as slime's and the embedded trainer's do), not once per process. A flag
of the wrong type (``None`` where slime's parser always gives a number) fails when the view is
built, whichever of its fields the caller reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "SLIME_DEFAULT_ROLLOUT_FUNCTION",
    "ActorArgs",
    "AdvantageArgs",
    "LogProbArgs",
    "OptimizerArgs",
    "PolicyLossArgs",
    "actor_args",
    "advantage_args",
    "log_prob_args",
    "optimizer_args",
    "policy_loss_args",
]

SLIME_DEFAULT_ROLLOUT_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"
"""slime's default ``--rollout-function-path``."""


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _int_if_set(value: Any) -> int | None:
    """``int(value)`` when truthy, else None (0 and "" read as unset)."""
    return int(value) if value else None


@dataclass(frozen=True)
class ActorArgs:
    """The trainer's own flags (embedded trainer, slime actor, the training drivers)."""

    hf_checkpoint: str | None = None
    device: str | None = "auto"
    """dressage's own (embedded trainer): ``auto``, ``cpu``, ``cuda``..."""
    seed: int = 1234
    loss_type: str = "policy_loss"
    custom_loss_function_path: str | None = None
    use_opd: bool = False
    opd_type: str | None = None
    opd_teacher_load: str | None = None
    ref_load: str | None = None
    ref_ckpt_step: int | None = None
    bf16: bool = False
    """Megatron's flag; the embedded trainer autocasts to bfloat16 on CUDA."""
    use_dynamic_batch_size: bool = False
    micro_batch_size: int | None = 1
    """None only when ``args`` says None (the embedded schedule then refuses fixed batches)."""
    max_tokens_per_gpu: int | None = None
    log_probs_max_tokens: int = 16384
    """dressage's own (embedded trainer): padded tokens per no-grad scoring micro-batch."""
    calculate_per_token_loss: bool = False
    rollout_data_postprocess_path: str | None = None
    custom_convert_samples_to_train_data_path: str | None = None
    rollout_function_path: str | None = SLIME_DEFAULT_ROLLOUT_FUNCTION
    save: str | None = None
    save_interval: int | None = None
    load: str | None = None
    ckpt_step: int | None = None
    start_rollout_id: int | None = None
    """As given: None means "from the loaded checkpoint" (``LoopArgs`` reads it as 0)."""
    context_parallel_size: int = 1
    """Megatron's ``--context-parallel-size``; 0 or None read as 1."""
    debug_rollout_only: bool = False
    use_routing_replay: bool = False
    check_weight_update_equal: bool = False
    use_critic: bool = False
    """Not a flag: slime derives it (``--advantage-estimator ppo``)."""
    colocate: bool = False
    release_train: bool = False
    continued: bool = False
    """``--dressage-continue-from`` was applied (``args.dressage_continue_state`` is set)."""


def actor_args(args: Any) -> ActorArgs:
    """Read :class:`ActorArgs` from slime's ``args`` (any object with attributes)."""
    return ActorArgs(
        hf_checkpoint=getattr(args, "hf_checkpoint", None),
        device=getattr(args, "device", "auto"),
        seed=int(getattr(args, "seed", 1234)),
        loss_type=getattr(args, "loss_type", "policy_loss"),
        custom_loss_function_path=getattr(args, "custom_loss_function_path", None),
        use_opd=bool(getattr(args, "use_opd", False)),
        opd_type=getattr(args, "opd_type", None),
        opd_teacher_load=getattr(args, "opd_teacher_load", None),
        ref_load=getattr(args, "ref_load", None),
        ref_ckpt_step=getattr(args, "ref_ckpt_step", None),
        bf16=bool(getattr(args, "bf16", False)),
        use_dynamic_batch_size=bool(getattr(args, "use_dynamic_batch_size", False)),
        micro_batch_size=_int_or_none(getattr(args, "micro_batch_size", 1)),
        max_tokens_per_gpu=_int_or_none(getattr(args, "max_tokens_per_gpu", None)),
        log_probs_max_tokens=int(getattr(args, "log_probs_max_tokens", 16384)),
        calculate_per_token_loss=bool(getattr(args, "calculate_per_token_loss", False)),
        rollout_data_postprocess_path=getattr(args, "rollout_data_postprocess_path", None),
        custom_convert_samples_to_train_data_path=getattr(
            args, "custom_convert_samples_to_train_data_path", None
        ),
        rollout_function_path=getattr(
            args, "rollout_function_path", SLIME_DEFAULT_ROLLOUT_FUNCTION
        ),
        save=getattr(args, "save", None),
        save_interval=getattr(args, "save_interval", None),
        load=getattr(args, "load", None),
        ckpt_step=getattr(args, "ckpt_step", None),
        start_rollout_id=getattr(args, "start_rollout_id", None),
        context_parallel_size=int(getattr(args, "context_parallel_size", 1) or 1),
        debug_rollout_only=bool(getattr(args, "debug_rollout_only", False)),
        use_routing_replay=bool(getattr(args, "use_routing_replay", False)),
        check_weight_update_equal=bool(getattr(args, "check_weight_update_equal", False)),
        use_critic=bool(getattr(args, "use_critic", False)),
        colocate=bool(getattr(args, "colocate", False)),
        release_train=bool(getattr(args, "release_train", False)),
        continued=bool(getattr(args, "dressage_continue_state", None)),
    )


@dataclass(frozen=True)
class OptimizerArgs:
    """Adam, gradient clipping and Megatron's learning-rate schedule, with slime's and
    Megatron's defaults; and the batch sizes that give the schedule its length."""

    lr: float = 1e-6
    """slime resets Megatron's ``--lr`` default to 1e-6."""
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    """0 (or None) turns clipping off."""
    min_lr: float = 0.0
    lr_warmup_iters: int = 0
    lr_decay_style: str = "constant"
    """The embedded trainer's default; Megatron's own is ``linear``."""
    lr_decay_iters: int | None = None
    """None (or 0): the run's optimizer steps, from ``num_rollout``."""
    num_rollout: int | None = None
    n_samples_per_prompt: int = 1
    rollout_batch_size: int | None = None
    """Prompts a rollout (slime requires it)."""
    global_batch_size: int | None = None
    """Samples an optimizer step (slime requires it)."""


def _float(args: Any, name: str, default: float) -> float:
    value = getattr(args, name, None)
    return default if value is None else float(value)


def optimizer_args(args: Any) -> OptimizerArgs:
    """Read :class:`OptimizerArgs` from slime's ``args``."""
    return OptimizerArgs(
        lr=_float(args, "lr", 1e-6),
        weight_decay=_float(args, "weight_decay", 0.01),
        adam_beta1=_float(args, "adam_beta1", 0.9),
        adam_beta2=_float(args, "adam_beta2", 0.999),
        adam_eps=_float(args, "adam_eps", 1e-8),
        clip_grad=float(getattr(args, "clip_grad", 1.0) or 0.0),
        min_lr=float(getattr(args, "min_lr", 0.0) or 0.0),
        lr_warmup_iters=int(getattr(args, "lr_warmup_iters", 0) or 0),
        lr_decay_style=str(getattr(args, "lr_decay_style", "constant") or "constant"),
        lr_decay_iters=_int_if_set(getattr(args, "lr_decay_iters", None)),
        num_rollout=_int_if_set(getattr(args, "num_rollout", None)),
        n_samples_per_prompt=int(getattr(args, "n_samples_per_prompt", 1) or 1),
        rollout_batch_size=_int_if_set(getattr(args, "rollout_batch_size", None)),
        global_batch_size=_int_if_set(getattr(args, "global_batch_size", None)),
    )


@dataclass(frozen=True)
class AdvantageArgs:
    """What slime's ``compute_advantages_and_returns`` reads (docs/slime.md §4.2)."""

    advantage_estimator: str = "grpo"
    custom_advantage_function_path: str | None = None
    use_rollout_logprobs: bool = False
    kl_coef: float = 0.0
    kl_loss_type: str = "k1"
    normalize_advantages: bool = False
    gamma: float = 1.0
    use_opd: bool = False
    opd_kl_coef: float = 1.0
    """None reads as 0.0."""

    @property
    def student_key(self) -> str:
        """The ``rollout_data`` key of the student's old log-probs."""
        return "rollout_log_probs" if self.use_rollout_logprobs else "log_probs"


def advantage_args(args: Any) -> AdvantageArgs:
    """Read :class:`AdvantageArgs` from slime's ``args``."""
    return AdvantageArgs(
        advantage_estimator=getattr(args, "advantage_estimator", "grpo"),
        custom_advantage_function_path=getattr(args, "custom_advantage_function_path", None),
        use_rollout_logprobs=bool(getattr(args, "use_rollout_logprobs", False)),
        kl_coef=float(getattr(args, "kl_coef", 0.0) or 0.0),
        kl_loss_type=getattr(args, "kl_loss_type", "k1"),
        normalize_advantages=bool(getattr(args, "normalize_advantages", False)),
        gamma=float(getattr(args, "gamma", 1.0)),
        use_opd=bool(getattr(args, "use_opd", False)),
        opd_kl_coef=float(getattr(args, "opd_kl_coef", 1.0) or 0.0),
    )


@dataclass(frozen=True)
class PolicyLossArgs:
    """What slime's policy loss reads (docs/slime.md §3.4)."""

    advantage_estimator: str = "grpo"
    use_tis: bool = False
    use_opsm: bool = False
    entropy_coef: float = 0.0
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    """None: ``eps_clip``."""
    eps_clip_c: float | None = None
    use_kl_loss: bool = False
    kl_loss_type: str = "k1"
    kl_loss_coef: float = 0.0
    use_rollout_logprobs: bool = False


def policy_loss_args(args: Any) -> PolicyLossArgs:
    """Read :class:`PolicyLossArgs` from slime's ``args``."""
    return PolicyLossArgs(
        advantage_estimator=getattr(args, "advantage_estimator", "grpo"),
        use_tis=bool(getattr(args, "use_tis", False)),
        use_opsm=bool(getattr(args, "use_opsm", False)),
        entropy_coef=float(getattr(args, "entropy_coef", 0.0) or 0.0),
        eps_clip=float(getattr(args, "eps_clip", 0.2)),
        eps_clip_high=_float_or_none(getattr(args, "eps_clip_high", None)),
        eps_clip_c=_float_or_none(getattr(args, "eps_clip_c", None)),
        use_kl_loss=bool(getattr(args, "use_kl_loss", False)),
        kl_loss_type=getattr(args, "kl_loss_type", "k1"),
        kl_loss_coef=float(getattr(args, "kl_loss_coef", 0.0)),
        use_rollout_logprobs=bool(getattr(args, "use_rollout_logprobs", False)),
    )


@dataclass(frozen=True)
class LogProbArgs:
    """How log-probs are taken from logits, in the losses and the no-grad scoring passes."""

    rollout_temperature: float = 1.0
    """0 (or None) reads as 1.0."""
    log_probs_chunk_size: int = -1
    """Tokens per log-softmax chunk; 0, None or negative: automatic."""
    log_prob_function_path: str | None = None
    """dressage's own: the logits-to-log-probs hook (``dressage.training.log_probs``)."""

    @property
    def chunk_tokens(self) -> int:
        """``log_probs_chunk_size`` as the log-prob functions take it (0: automatic)."""
        return max(self.log_probs_chunk_size, 0)


def log_prob_args(args: Any) -> LogProbArgs:
    """Read :class:`LogProbArgs` from slime's ``args``."""
    return LogProbArgs(
        rollout_temperature=float(getattr(args, "rollout_temperature", 1.0) or 1.0),
        log_probs_chunk_size=int(getattr(args, "log_probs_chunk_size", -1) or -1),
        log_prob_function_path=getattr(args, "log_prob_function_path", None),
    )
