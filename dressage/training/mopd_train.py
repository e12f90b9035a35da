"""MOPD on slime: the synchronous loop of slime's ``train.py``, with the MOPD actor and hooks.

    python -m dressage.training.mopd_train --mopd-config run/mopd.json \\
        --hf-checkpoint ... --ref-load ... <Megatron model flags> <slime flags>

Normally built and launched by dressage.launch.slime_command (scripts/run_mopd_qwen3.5_sync.sh).
Flags the MOPD objective needs are added when absent (``--loss-type custom_loss``, the MOPD
advantage/loss/converter/data-source hooks, ``--disable-rewards-normalization``); then the parsed
options, the MOPD config and every checkpoint are validated before any Ray actor exists, and the
advantage estimator is labelled ``mopd`` (the custom advantage hook bypasses slime's estimator
dispatch, reference/slime.md §2). Driver metrics (phase timings per rollout) go to
``<--mopd-metrics-dir>/driver.jsonl``; slime keeps W&B (``--use-wandb``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dressage.config.env import env_str
from dressage.config.mopd import (
    MOPD_HOOKS,
    MopdConfigError,
    Problem,
    load_mopd_config,
    validate_mopd_run,
)

__all__ = ["MOPD_FLAG_DEFAULTS", "add_mopd_arguments", "main", "preflight", "with_mopd_defaults"]

ROLLOUT_LOG_HOOK = "dressage.training.metrics.log_rollout_metrics"

# (flag, value or None for a switch): appended to argv when the flag is absent.
MOPD_FLAG_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--loss-type", "custom_loss"),
    ("--custom-loss-function-path", MOPD_HOOKS["custom_loss_function_path"]),
    ("--custom-advantage-function-path", MOPD_HOOKS["custom_advantage_function_path"]),
    (
        "--custom-convert-samples-to-train-data-path",
        MOPD_HOOKS["custom_convert_samples_to_train_data_path"],
    ),
    ("--custom-reward-post-process-path", MOPD_HOOKS["custom_reward_post_process_path"]),
    ("--data-source-path", MOPD_HOOKS["data_source_path"]),
    ("--custom-rm-path", MOPD_HOOKS["custom_rm_path"]),
    ("--custom-generate-function-path", MOPD_HOOKS["custom_generate_function_path"]),
    ("--custom-rollout-log-function-path", ROLLOUT_LOG_HOOK),
    ("--disable-rewards-normalization", None),
)


def with_mopd_defaults(argv: Sequence[str]) -> list[str]:
    """``argv`` plus every MOPD flag it does not set (an explicit value is kept, then checked)."""
    present = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    out = list(argv)
    for flag, value in MOPD_FLAG_DEFAULTS:
        if flag not in present:
            out += [flag] if value is None else [flag, value]
    return out


def add_mopd_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """slime's ``parse_args(add_custom_arguments=...)`` hook: the MOPD options."""
    group = parser.add_argument_group("MOPD (dressage)")
    group.add_argument(
        "--mopd-config",
        default=env_str("DRESSAGE_MOPD_TEACHER_CONFIG"),
        help="MOPD JSON (teachers, datasets); default $DRESSAGE_MOPD_TEACHER_CONFIG",
    )
    group.add_argument(
        "--mopd-advantage-clip",
        type=float,
        default=None,
        help="c in A_t = clip(log pi_T - log pi_old, -c, c) (default: dressage.training.mopd_loss)",
    )
    group.add_argument(
        "--dressage-proxy-url",
        default=env_str("DRESSAGE_PROXY_URL"),
        help="the recording proxy the black-box rollout runs agents against "
        "(default $DRESSAGE_PROXY_URL)",
    )
    group.add_argument(
        "--mopd-metrics-dir",
        default=None,
        help="folder of the JSONL metrics logs (default: <--save>/metrics)",
    )
    return parser


def parse_mopd_args(argv: Sequence[str] | None = None) -> Any:
    """slime's parser over ``argv`` plus the MOPD defaults; the estimator is labelled ``mopd``."""
    from slime.utils.arguments import parse_args

    # Megatron's parser reads sys.argv itself.
    sys.argv = [sys.argv[0], *with_mopd_defaults(sys.argv[1:] if argv is None else argv)]
    args = parse_args(add_custom_arguments=add_mopd_arguments)
    args.advantage_estimator = "mopd"
    if args.mopd_metrics_dir is None:
        args.mopd_metrics_dir = str(Path(args.save or ".") / "metrics")
    return args


def preflight(args: Any) -> None:
    """Fail before any actor exists: config, options, imports, environment and checkpoints."""
    from dressage.training.checkpoints import validate_mopd_checkpoints

    config = load_mopd_config(args.mopd_config)
    report = validate_mopd_run(config, args)
    report.problems += validate_mopd_checkpoints(
        config,
        hf_checkpoint=getattr(args, "hf_checkpoint", None),
        ref_load=getattr(args, "ref_load", None),
        ckpt_step=getattr(args, "ref_ckpt_step", None),
    )
    if getattr(args, "release_train", False):
        report.problems.append(
            Problem("option --release-train", "not supported by the MOPD driver")
        )
    report.raise_if_failed("MOPD run")


def _periodic(rollout_id: int, interval: int | None, num_rollout: int | None = None) -> bool:
    if not interval:
        return False
    last = num_rollout is not None and rollout_id + 1 == num_rollout
    return (rollout_id + 1) % interval == 0 or last


def train(args: Any) -> None:
    """slime ``train.py``'s loop (reference/slime.md §6.1) with ``actor_cls`` set."""
    import ray
    from slime.observability.logging_utils import finish_tracking, init_tracking
    from slime.ray.placement_group import (
        create_placement_groups,
        create_rollout_manager,
        create_training_models,
    )

    from dressage.training.metrics import MetricsSink
    from dressage.training.mopd_actor import make_mopd_actor_cls

    pgs = create_placement_groups(args)
    init_tracking(args)
    rollout_manager, _ = create_rollout_manager(args, pgs["rollout"])
    actor_model, critic_model = create_training_models(
        args, pgs, rollout_manager, actor_cls=make_mopd_actor_cls()
    )
    if critic_model is not None:  # preflight refuses ppo; a critic here means slime changed
        raise RuntimeError("MOPD trains no critic, but slime created one")

    if args.offload_rollout:
        ray.get(rollout_manager.onload_weights.remote())
    actor_model.update_weights()
    if getattr(args, "check_weight_update_equal", False):
        ray.get(rollout_manager.check_weights.remote(action="compare"))
    if args.offload_rollout:
        ray.get(rollout_manager.onload_kv.remote())
    if args.num_rollout == 0 and args.eval_interval is not None:
        ray.get(rollout_manager.eval.remote(0))

    sink = MetricsSink(Path(args.mopd_metrics_dir) / "driver.jsonl")
    try:
        for rollout_id in range(getattr(args, "start_rollout_id", 0) or 0, args.num_rollout):
            if (
                rollout_id == 0
                and args.eval_interval is not None
                and not getattr(args, "skip_eval_before_train", False)
            ):
                ray.get(rollout_manager.eval.remote(rollout_id))
            started = time.monotonic()
            rollout_data_ref = ray.get(rollout_manager.generate.remote(rollout_id))
            generated = time.monotonic()
            if args.offload_rollout:
                ray.get(rollout_manager.offload.remote())
            ray.get(actor_model.async_train(rollout_id, rollout_data_ref))
            trained = time.monotonic()
            if _periodic(rollout_id, args.save_interval, args.num_rollout):
                actor_model.save_model(rollout_id, force_sync=rollout_id + 1 == args.num_rollout)
                ray.get(rollout_manager.save.remote(rollout_id))
            if not getattr(args, "offload_train", False):
                actor_model.clear_memory()
            if args.offload_rollout:
                ray.get(rollout_manager.onload_weights.remote())
            actor_model.update_weights()
            if args.offload_rollout:
                ray.get(rollout_manager.onload_kv.remote())
            updated = time.monotonic()
            if _periodic(rollout_id, args.eval_interval):
                ray.get(rollout_manager.eval.remote(rollout_id))
            sink.log(
                rollout_id,
                {
                    "time/generate_s": generated - started,
                    "time/train_s": trained - generated,
                    "time/update_weights_s": updated - trained,
                    "time/step_s": time.monotonic() - started,
                },
            )
    finally:
        sink.close()
    ray.get(rollout_manager.dispose.remote())
    finish_tracking(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_mopd_args(argv)
    try:
        preflight(args)
    except MopdConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
