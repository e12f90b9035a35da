"""The embedded trainer's options: slime's flag names (as ``args`` attributes) and defaults.

The embedded trainer reads the same ``argparse.Namespace`` attributes slime's actor reads, so a
run's options mean the same on one machine and on a cluster. Defaults are slime's / Megatron's
(``--eps-clip 0.2``, ``--adam-beta2 0.999``, ``--clip-grad 1.0``, ...), plus four of our own:
``device`` (``auto``/``cpu``/``cuda``), ``mopd_advantage_clip`` and ``mopd_objective`` (read by
the MOPD hooks; with ``dense`` the trainer also keeps each teacher's whole log-softmax at the
response positions), and ``log_prob_function_path`` (see ``dressage.training.log_probs``)::

    args = trainer_args(global_batch_size=4, lr=1e-5, loss_type="custom_loss", ...)
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

__all__ = ["LR_DECAY_STYLES", "SLIME_TRAIN_DEFAULTS", "trainer_args"]

LR_DECAY_STYLES = ("constant", "linear", "cosine")
"""``--lr-decay-style`` values the embedded trainer implements (Megatron has more)."""

SLIME_TRAIN_DEFAULTS: dict[str, Any] = {
    # model / device
    "hf_checkpoint": None,
    "device": "auto",
    "bf16": False,  # autocast to bfloat16 on CUDA; master weights stay in their dtype
    "seed": 1234,
    # checkpoints (slime's; dressage.training.embedded.checkpoint)
    "save": None,  # where checkpoints go: Megatron's tracker and iter_XXXXXXX/ folders
    "save_interval": None,  # rollouts between saves, and the last; needs save
    "load": None,  # resume from the newest complete checkpoint here (none: start fresh)
    "ckpt_step": None,  # load this iteration instead of the tracker's
    "start_rollout_id": None,  # default: the loaded checkpoint's rollout + 1, else 0
    # batching (docs/slime.md §5)
    "global_batch_size": None,  # rollouts per optimizer step: required
    "micro_batch_size": 1,
    "use_dynamic_batch_size": False,
    "max_tokens_per_gpu": None,
    "log_probs_max_tokens": 16384,  # padded tokens per no-grad scoring micro-batch
    "log_probs_chunk_size": -1,
    # optimizer (Megatron defaults)
    "lr": 1e-6,
    "lr_decay_style": "constant",  # constant | linear | cosine (Megatron's names)
    "min_lr": 0.0,
    "lr_warmup_iters": 0,
    "lr_decay_iters": None,  # default: the run's optimizer steps (num_rollout x steps a rollout)
    "weight_decay": 0.01,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_eps": 1e-8,
    "clip_grad": 1.0,
    # advantages (docs/slime.md §4.2)
    "advantage_estimator": "grpo",
    "dressage_prompt_equal_estimators": None,  # --dressage-prompt-equal-estimators
    "custom_advantage_function_path": None,
    "rollout_data_postprocess_path": None,
    "normalize_advantages": False,
    "gamma": 1.0,
    "lambd": 1.0,
    "kl_coef": 0.0,
    "use_rollout_logprobs": False,
    # loss (docs/slime.md §3.4)
    "loss_type": "policy_loss",
    "custom_loss_function_path": None,
    "calculate_per_token_loss": False,
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "entropy_coef": 0.0,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "ref_load": None,
    "use_tis": False,
    "rollout_temperature": 1.0,
    # on-policy distillation (docs/slime.md §7.2) and MOPD
    "use_opd": False,
    "opd_type": None,
    "opd_kl_coef": 1.0,
    "opd_teacher_load": None,
    "mopd_advantage_clip": None,
    "mopd_objective": "sampled",  # the hooks' reading when unset (the jobs set it: mopd_dense)
    "mopd_topk": None,  # --mopd-topk K of topk (None: dressage.training.mopd_topk's default)
    "mopd_forward_kl_weight": 0.0,  # the dense loss's forward-KL share (JobOptions)
    "log_prob_function_path": None,
}


def trainer_args(**overrides: Any) -> Namespace:
    """slime-named options with defaults; unknown names are kept (slime allows custom ones)."""
    values = dict(SLIME_TRAIN_DEFAULTS)
    values.update(overrides)
    return Namespace(**values)
