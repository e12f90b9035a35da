"""slime's defaults for the flags the typed views in ``dressage.slime`` read, as data.

``SLIME_DEFAULTS[view][field]`` is slime's parser default for the flag behind ``field`` (flag
``--`` + field with ``-`` for ``_``). tests/slime/test_view_args.py checks each view against it;
tests/real_slime/test_view_flag_defaults.py checks it against slime's own parser source.
``DIFFERENT`` lists the fields whose view default is not slime's, and why.
"""

from __future__ import annotations

from typing import Any

SLIME_DEFAULTS: dict[str, dict[str, Any]] = {
    "ActorArgs": {
        "hf_checkpoint": None,
        "seed": 1234,
        "loss_type": "policy_loss",
        "custom_loss_function_path": None,
        "use_opd": False,
        "opd_type": None,
        "opd_teacher_load": None,
        "ref_load": None,
        "ref_ckpt_step": None,
        "use_dynamic_batch_size": False,
        "micro_batch_size": 1,
        "max_tokens_per_gpu": None,
        "rollout_data_postprocess_path": None,
        "custom_convert_samples_to_train_data_path": None,
        "rollout_function_path": "slime.rollout.sglang_rollout.generate_rollout",
        "save": None,
        "save_interval": None,
        "load": None,
        "start_rollout_id": None,
        "debug_rollout_only": False,
        "use_routing_replay": False,
        "colocate": False,
        "release_train": False,
        "check_weight_update_equal": False,
    },
    "OptimizerArgs": {
        "lr": 1e-6,
        "clip_grad": 1.0,
        "n_samples_per_prompt": 1,
        "rollout_batch_size": None,
        "global_batch_size": None,
    },
    "AdvantageArgs": {
        "advantage_estimator": "grpo",
        "custom_advantage_function_path": None,
        "use_rollout_logprobs": False,
        "kl_coef": 0.0,
        "kl_loss_type": "k1",
        "normalize_advantages": False,
        "gamma": 1.0,
        "use_opd": False,
        "opd_kl_coef": 1.0,
    },
    "PolicyLossArgs": {
        "advantage_estimator": "grpo",
        "use_tis": False,
        "use_opsm": False,
        "entropy_coef": 0.0,
        "eps_clip": 0.2,
        "eps_clip_high": None,
        "eps_clip_c": None,
        "use_kl_loss": False,
        "kl_loss_type": "k1",
        "kl_loss_coef": 0.0,
        "use_rollout_logprobs": False,
    },
    "LogProbArgs": {"rollout_temperature": 1.0, "log_probs_chunk_size": -1},
    "MopdArgs": {"allgather_cp": False, "rollout_top_p": 1.0},
    "RolloutArgs": {
        "rollout_temperature": 1.0,
        "rollout_top_p": 1.0,
        "rollout_top_k": -1,
        "rollout_max_response_len": None,
        "rollout_stop": None,
        "rollout_stop_token_ids": None,
        "rollout_skip_special_tokens": False,
        "custom_generate_function_path": None,
        "custom_rm_path": None,
        "group_rm": False,
        "rollout_sample_hook_path": [],
        "dynamic_sampling_filter_path": None,
        "n_samples_per_prompt": 1,
        "sglang_server_concurrency": 512,
        "rollout_shuffle": False,
        "rollout_seed": 42,
        "prompt_data": None,
        "input_key": "input",
        "label_key": None,
        "metadata_key": "metadata",
        "tool_key": "tools",
        "save": None,
        "load": None,
    },
}

DIFFERENT: dict[tuple[str, str], str] = {
    ("RolloutArgs", "rollout_sample_hook_path"): "read as a tuple: slime's [] is ()",
    ("RolloutArgs", "tool_key"): "a Namespace without it reads no tools (the data source's rule)",
}
"""Fields whose view default differs from slime's; reading slime's default still gives the
view's reading of it (tests/slime/test_view_args.py)."""
