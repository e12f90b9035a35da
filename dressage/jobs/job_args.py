"""The slime-named ``args`` of an embedded training job, from RUN.json and its ``advanced`` options.

Every part of the embedded default reads the same ``argparse.Namespace`` attributes slime's
would (the trainer, the rollout manager, the rollout function, the dispatch, the data source and
the hooks), so one :func:`job_args` builds them all from a :class:`TrainRunConfig`::

    options = JobOptions.model_validate(run.advanced)
    args = job_args(run, options, student=Path("/ckpt/student"), admin_key=KEY)

The objective picks the hooks: ``mopd`` uses the MOPD advantage, loss, converter and reward
post-processing (``dressage.config.mopd.MOPD_HOOKS``) with one sample per prompt; ``grpo`` uses
slime's GRPO estimator and policy loss with ``n_samples_per_prompt`` samples per prompt. One
optimizer step per rollout (``global_batch_size`` = prompts x samples per prompt) unless
``num_steps_per_rollout`` splits it, as slime's flag of that name does.
Checkpoints go to ``output_dir/checkpoints`` every ``save_interval`` steps (``--save``,
``--save-interval``), and ``--load`` is the same folder, so rerunning the job resumes.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from dressage.config.job import JobOptions
from dressage.config.mopd import MOPD_HOOKS
from dressage.config.run import TrainRunConfig
from dressage.jobs.cluster import PARTIAL_ASYNC_ROLLOUT
from dressage.training.embedded import trainer_args

__all__ = ["job_args"]

SYNC_ROLLOUT = "dressage.rollout.sync_rollout.generate_rollout"


def job_args(
    run: TrainRunConfig, options: JobOptions, *, student: Path, admin_key: str | None
) -> Namespace:
    """The run's slime-named options (see the module docstring)."""
    mopd = run.objective == "mopd"
    n = 1 if mopd else options.n_samples_per_prompt
    checkpoints = Path(run.output_dir) / "checkpoints"
    values: dict[str, object] = {
        # trainer (dressage.training.embedded)
        "hf_checkpoint": str(student),
        "device": options.device,
        "seed": run.seed,
        "lr": options.learning_rate,
        "lr_decay_style": options.lr_decay_style,
        "min_lr": options.min_lr,
        "lr_warmup_iters": options.lr_warmup_iters,
        "global_batch_size": options.optimizer_batch_size(
            objective=run.objective, rollout_batch_size=run.rollout_batch_size
        ),
        "use_dynamic_batch_size": options.max_tokens_per_gpu is not None,
        "max_tokens_per_gpu": options.max_tokens_per_gpu,
        "rollout_temperature": options.temperature,
        # driver (slime's train_async.py names)
        "num_rollout": run.num_steps,
        "update_weights_interval": 1,
        "save": str(checkpoints),
        "save_interval": options.save_interval,
        "load": str(checkpoints),  # the run's own: a rerun resumes (none yet: starts fresh)
        "eval_interval": options.eval_interval,
        # rollout
        "rollout_function_path": (
            PARTIAL_ASYNC_ROLLOUT if options.partial_rollout else SYNC_ROLLOUT
        ),
        "rollout_batch_size": run.rollout_batch_size,
        "n_samples_per_prompt": n,
        "rollout_max_response_len": options.max_response_len,
        "rollout_seed": run.seed,
        "rollout_shuffle": options.shuffle,
        "mopd_config": run.mopd_config,
        "data_source_path": MOPD_HOOKS["data_source_path"],
        "custom_generate_function_path": MOPD_HOOKS["custom_generate_function_path"],
        "custom_rm_path": MOPD_HOOKS["custom_rm_path"],
        "custom_convert_samples_to_train_data_path": MOPD_HOOKS[
            "custom_convert_samples_to_train_data_path"
        ],
        "custom_reward_post_process_path": MOPD_HOOKS["custom_reward_post_process_path"],
        "dressage_proxy_url": run.proxy_url,
        "dressage_proxy_admin_key": admin_key,
        "dressage_agent": options.agent,
        "dressage_agent_max_turns": options.agent_max_turns,
        "dressage_agent_timeout": options.agent_timeout_s,
        "dressage_max_staleness": options.max_staleness,
        "dressage_stale_policy": options.stale_policy,
        "dressage_async_groups_in_flight": options.groups_in_flight,
        "dressage_async_max_groups_ahead": options.max_groups_ahead,
    }
    if mopd:
        values |= {
            "advantage_estimator": "mopd",
            "loss_type": "custom_loss",
            "custom_loss_function_path": MOPD_HOOKS["custom_loss_function_path"],
            "custom_advantage_function_path": MOPD_HOOKS["custom_advantage_function_path"],
            "rewards_normalization": False,
            "mopd_advantage_clip": options.mopd_advantage_clip,
            "mopd_objective": options.mopd_objective,
            "mopd_topk": options.mopd_topk,
            "mopd_forward_kl_weight": options.mopd_forward_kl_weight,
        }
    else:
        values |= {
            "advantage_estimator": "grpo",
            "loss_type": "policy_loss",
            "use_kl_loss": options.kl_loss_coef > 0,
            "kl_loss_coef": options.kl_loss_coef,
            "kl_loss_type": options.kl_loss_type,
            "entropy_coef": options.entropy_coef,
            "dynamic_sampling_filter_path": options.dynamic_sampling_filter,
        }
    return trainer_args(**values)
