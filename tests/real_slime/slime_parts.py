"""Small pieces of slime that several tier tests drive: its rollout manager's converter and DP
split without Ray actors, and the per-rank data its trainer reads."""

from __future__ import annotations

from typing import Any


def plain_rollout_manager() -> type:
    """slime's ``RolloutManager`` class under its ``ray.remote`` decorator."""
    import slime.ray.rollout as rollout

    cls = rollout.RolloutManager
    plain: type = getattr(cls, "__ray_actor_class__", None) or getattr(
        getattr(cls, "__ray_metadata__", None), "modified_class", cls
    )  # the class itself where ray is stood in (tests/real_slime/gpu_rig.py)
    return plain


def bare_manager(args: Any, dp_size: int = 1) -> Any:
    """A manager without ``__init__`` (which starts engines): what slime's default converter and
    its DP split read."""
    out = object.__new__(plain_rollout_manager())
    out.args = args
    out.custom_convert_samples_to_train_data_func = None
    out.custom_reward_post_process_func = None
    out.train_parallel_config = {
        "dp_size": dp_size,
        "cp_size": 1,
        "vpp_size": 1,
        "microbatch_group_size_per_vp_stage": 1,
    }
    return out


def no_object_store(monkeypatch: Any) -> None:
    """``ray.put``/``ray.get`` as the identity where slime's split and trainer call them."""
    import types

    import slime.ray.rollout as rollout
    import slime.utils.data as slime_data

    monkeypatch.setattr(rollout, "ray", types.SimpleNamespace(put=lambda value, **_: value))
    monkeypatch.setattr(slime_data, "ray", types.SimpleNamespace(get=lambda value: value))


def split_per_rank(
    args: Any, data: dict[str, Any], dp_size: int, monkeypatch: Any
) -> list[dict[str, Any]]:
    """slime's ``_split_train_data_by_dp`` then ``process_rollout_data`` for every rank."""
    import slime.utils.data as slime_data

    no_object_store(monkeypatch)
    refs = bare_manager(args, dp_size)._split_train_data_by_dp(data)
    return [slime_data.process_rollout_data(args, refs, r, dp_size) for r in range(dp_size)]


# slime options of its DP split and train-side logging, as its parser leaves them when no
# tracker or extra report is asked for
SPLIT_AND_LOGGING_ARGS: dict[str, Any] = {
    "balance_data": False,
    "balance_by_flops": False,
    "rollout_data_transport": "object-store",
    "use_wandb": False,
    "use_tensorboard": False,
    "wandb_always_use_train_step": False,
    "ci_test": False,
    "log_multi_turn": False,
    "log_passrate": False,
    "log_correct_samples": False,
}

# slime options of the MOPD objective on its loss path (the hooks named, the rest neutral)
MOPD_LOSS_ARGS: dict[str, Any] = {
    "advantage_estimator": "mopd",
    "custom_advantage_function_path": "dressage.training.mopd_loss.compute_mopd_advantages",
    "custom_loss_function_path": "dressage.training.mopd_loss.mopd_policy_loss",
    "loss_type": "custom_loss",
    "kl_coef": 0.0,
    "use_rollout_logprobs": False,
    "use_opd": False,
    "normalize_advantages": False,
    "allgather_cp": False,
    "log_probs_chunk_size": -1,
    "entropy_coef": 0.0,
    "rollout_top_p": 1.0,
}
