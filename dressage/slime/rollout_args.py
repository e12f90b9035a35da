"""A typed view of the slime flags (and dressage's partial-rollout flags) the rollouts read.

:func:`rollout_args` reads them once from slime's ``args`` with slime's defaults: the sampling
flags (``--rollout-*``, slime's default ``sampling_params``), the generate and reward hooks, the
data source's flags, and dressage's partial-rollout options
(``dressage.training.train_async_with_rollout_pause.add_rollout_pause_arguments``). The
environment fallbacks (``$DRESSAGE_PROXY_URL``, ...) stay with the callers.

Sampling reads as slime's ``sglang_rollout`` does: a ``--rollout-top-p`` or
``--rollout-temperature`` of 0 means 1.0 and a ``--rollout-top-k`` of 0 means -1 (off). The MOPD
checks read ``--rollout-top-p`` without that fallback (``dressage.slime.mopd_args``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RolloutArgs", "rollout_args"]


def _int_if_set(value: Any) -> int | None:
    return int(value) if value else None


def _paths(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class RolloutArgs:
    # sampling (slime's default sampling_params)
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    rollout_max_response_len: int | None = None
    rollout_stop: list[str] | None = None
    rollout_stop_token_ids: list[int] | None = None
    rollout_skip_special_tokens: bool = False
    # hooks
    custom_generate_function_path: str | None = None
    custom_rm_path: str | None = None
    group_rm: bool = False
    rollout_sample_hook_path: tuple[str, ...] = ()
    dynamic_sampling_filter_path: str | None = None
    # batches and the data source
    rollout_batch_size: int = 1
    """slime requires it; an unset or 0 value reads as 1."""
    n_samples_per_prompt: int = 1
    sglang_server_concurrency: int = 512
    rollout_shuffle: bool = False
    rollout_seed: int = 42
    prompt_data: str | None = None
    dressage_datasets: str | list[Any] | None = None
    """Inline dataset specs: JSON text or a list of mappings (dressage.rollout.dataset_specs)."""
    mopd_config: str | None = None
    input_key: str | None = "input"
    label_key: str | None = None
    """A dataset's own key first, then this, then ``label``."""
    metadata_key: str | None = "metadata"
    tool_key: str | None = None
    """None when ``args`` lacks it (no tools read); slime's parser gives ``tools``."""
    save: str | None = None
    load: str | None = None
    dressage_continue_state: str | None = None
    """The data-source state ``--dressage-continue-from`` found (dressage.slime.continue_from)."""
    # dressage's partial rollout
    dressage_version_source_path: str | None = None
    dressage_proxy_url: str | None = None
    dressage_proxy_admin_key: str | None = None
    dressage_async_groups_in_flight: int | None = None
    """None (or 0): twice the rollout batch size."""
    dressage_async_max_groups_ahead: int | None = None
    """None (or 0): no bound."""
    dressage_max_staleness: int | None = None
    """None: no bound on a group's age in weight versions."""
    dressage_stale_policy: str = "drop"


def rollout_args(args: Any) -> RolloutArgs:
    """Read :class:`RolloutArgs` from slime's ``args`` (any object with attributes)."""
    seed = getattr(args, "rollout_seed", None)
    staleness = getattr(args, "dressage_max_staleness", None)
    return RolloutArgs(
        rollout_temperature=float(getattr(args, "rollout_temperature", 1.0) or 1.0),
        rollout_top_p=float(getattr(args, "rollout_top_p", 1.0) or 1.0),
        rollout_top_k=int(getattr(args, "rollout_top_k", -1) or -1),
        rollout_max_response_len=getattr(args, "rollout_max_response_len", None),
        rollout_stop=getattr(args, "rollout_stop", None),
        rollout_stop_token_ids=getattr(args, "rollout_stop_token_ids", None),
        rollout_skip_special_tokens=bool(getattr(args, "rollout_skip_special_tokens", False)),
        custom_generate_function_path=getattr(args, "custom_generate_function_path", None),
        custom_rm_path=getattr(args, "custom_rm_path", None),
        group_rm=bool(getattr(args, "group_rm", False)),
        rollout_sample_hook_path=_paths(getattr(args, "rollout_sample_hook_path", None)),
        dynamic_sampling_filter_path=getattr(args, "dynamic_sampling_filter_path", None),
        rollout_batch_size=int(getattr(args, "rollout_batch_size", None) or 1),
        n_samples_per_prompt=int(getattr(args, "n_samples_per_prompt", None) or 1),
        sglang_server_concurrency=int(getattr(args, "sglang_server_concurrency", None) or 512),
        rollout_shuffle=bool(getattr(args, "rollout_shuffle", False)),
        rollout_seed=42 if seed is None else int(seed),
        prompt_data=getattr(args, "prompt_data", None),
        dressage_datasets=getattr(args, "dressage_datasets", None),
        mopd_config=getattr(args, "mopd_config", None),
        input_key=getattr(args, "input_key", "input"),
        label_key=getattr(args, "label_key", None),
        metadata_key=getattr(args, "metadata_key", "metadata"),
        tool_key=getattr(args, "tool_key", None),
        save=getattr(args, "save", None),
        load=getattr(args, "load", None),
        dressage_continue_state=getattr(args, "dressage_continue_state", None),
        dressage_version_source_path=getattr(args, "dressage_version_source_path", None),
        dressage_proxy_url=getattr(args, "dressage_proxy_url", None),
        dressage_proxy_admin_key=getattr(args, "dressage_proxy_admin_key", None),
        dressage_async_groups_in_flight=_int_if_set(
            getattr(args, "dressage_async_groups_in_flight", None)
        ),
        dressage_async_max_groups_ahead=_int_if_set(
            getattr(args, "dressage_async_max_groups_ahead", None)
        ),
        dressage_max_staleness=None if staleness is None else int(staleness),
        dressage_stale_policy=getattr(args, "dressage_stale_policy", None) or "drop",
    )
