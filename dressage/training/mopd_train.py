"""MOPD on slime: the synchronous loop of slime's ``train.py``, with the MOPD actor and hooks.

    python -m dressage.training.mopd_train --mopd-config run/mopd.json \\
        --hf-checkpoint ... --ref-load ... <Megatron model flags> <slime flags>

Normally built and launched by dressage.launch.slime_command (scripts/run_mopd_qwen3.5_sync.sh).
Flags the MOPD objective needs are added when absent (``--loss-type custom_loss``, the MOPD
advantage/loss/converter/data-source hooks, ``--disable-rewards-normalization``); then the parsed
options, the MOPD config and every checkpoint are validated before any Ray actor exists, and the
advantage estimator is labelled ``mopd`` (the custom advantage hook bypasses slime's estimator
dispatch, docs/slime.md §2). Driver metrics (phase timings per rollout) go to
``<--mopd-metrics-dir>/driver.jsonl``; slime keeps W&B (``--use-wandb``).

The loop (:func:`train`) makes slime's ``train.py`` calls, in its order and with its arguments
(``tests/real_slime/test_drivers.py`` runs both against the same fakes): periodic saves and evals on
slime's ``should_run_periodic_action`` steps, epoch boundaries included, the last save and every
``--release-train`` save synchronous, the data source saved only with a global dataset, and
``--release-train`` honoured as slime does (the actor group, MOPD class kept, is recreated
before each step and released by its weight update; each new actor loads the teachers again in
its ``init``). Where it differs from ``train.py``, and why:

- ``create_training_models`` gets ``actor_cls=MopdMegatronActor`` (the teachers' scoring);
- ``--use-critic`` is refused before any call (MOPD has no value function: its advantage is the
  clipped teacher log-ratio), so slime's critic branches, ``external_data`` and the critic's
  ``clear_memory`` never apply;
- the phase timings of each step are written to ``driver.jsonl`` (no slime call).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dressage.config.job import DEFAULT_MOPD_OBJECTIVE, DEFAULT_MOPD_TOPK, MOPD_OBJECTIVES
from dressage.config.mopd import (
    MOPD_HOOKS,
    MopdConfigError,
    load_mopd_config,
    slime_objective_problems,
    validate_mopd_run,
)
from dressage.config.mopd_path import MOPD_CONFIG_ENV, mopd_config_path
from dressage.config.proxy_access import ProxyAccessSettings
from dressage.slime.args import LoopArgs, add_dressage_arguments, loop_args
from dressage.slime.continue_from import ContinueError, apply_continue_from
from dressage.slime.hooks import ROLLOUT_LOG_HOOK
from dressage.slime.mopd_args import MOPD_RESTORES, mopd_args
from dressage.slime.periodic import PeriodicAction, periodic_action
from dressage.slime.tracking import keep_wandb_run
from dressage.slime.train_args import actor_args

__all__ = [
    "MOPD_FLAG_DEFAULTS",
    "add_mopd_arguments",
    "check_config_and_checkpoints",
    "layer_mopd_arguments",
    "main",
    "with_mopd_defaults",
]

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
        default=None,
        help=f"MOPD JSON (teachers, datasets); default ${MOPD_CONFIG_ENV}",
    )
    group.add_argument(
        "--mopd-advantage-clip",
        type=float,
        default=None,
        help="c in A_t = clip(log pi_T - log pi_old, -c, c) (default: dressage.training.mopd_loss)",
    )
    group.add_argument(
        "--mopd-objective",
        choices=MOPD_OBJECTIVES,
        default=DEFAULT_MOPD_OBJECTIVE,
        help="sampled: -A_t log pi(y_t) at the sampled token; dense: the KL to the teacher over "
        "the whole vocabulary (embedded trainer only: refused here); topk: the KL over the "
        "teacher's top-K tokens, the sampled token and a tail bucket (default: %(default)s)",
    )
    group.add_argument(
        "--mopd-topk",
        type=int,
        default=None,
        metavar="K",
        help=f"topk only: the teacher's K most likely tokens kept a position, at least 1 and at "
        f"most the vocabulary (default: {DEFAULT_MOPD_TOPK})",
    )
    group.add_argument(
        "--mopd-forward-kl-weight",
        type=_unit_interval,
        default=0.0,
        metavar="B",
        help="dense and topk: the forward KL's share of each token's loss, in [0, 1]; the rest "
        "is the reverse KL (default: %(default)s)",
    )
    group.add_argument(
        "--mopd-restore",
        choices=MOPD_RESTORES,
        default=MOPD_RESTORES[0],
        help="how a teacher (and the student after it) is restored from pinned memory: streamed: "
        "layer by layer on a side CUDA stream while its pass runs (dressage.training."
        "weight_streaming); slime: slime's TensorBackuper.restore, whole before the pass "
        "(default: %(default)s; CPU runs always take slime's)",
    )
    group.add_argument(
        "--dressage-proxy-url",
        default=None,
        help="the recording proxy the black-box rollout runs agents against "
        f"(default ${ProxyAccessSettings.ENV['proxy_url']})",
    )
    group.add_argument(
        "--mopd-metrics-dir",
        default=None,
        help="folder of the JSONL metrics logs (default: <--save>/metrics)",
    )
    add_dressage_arguments(group)
    return parser


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


def layer_mopd_arguments(args: Any) -> None:
    """The flags that have a variable, layered after parsing: the flag over the variable
    (:mod:`dressage.config.layered`; the parser's defaults are None)."""
    args.mopd_config = mopd_config_path(args.mopd_config, given_as="--mopd-config")
    given = {"proxy_url": args.dressage_proxy_url}
    access = ProxyAccessSettings.layered(given, given_as={"proxy_url": "--dressage-proxy-url"})
    args.dressage_proxy_url = access.proxy_url


def parse_mopd_args(argv: Sequence[str] | None = None) -> Any:
    """slime's parser over ``argv`` plus the MOPD defaults; the estimator is labelled ``mopd``."""
    from slime.utils.arguments import parse_args

    # Megatron's parser reads sys.argv itself.
    sys.argv = [sys.argv[0], *with_mopd_defaults(sys.argv[1:] if argv is None else argv)]
    args = parse_args(add_custom_arguments=add_mopd_arguments)
    layer_mopd_arguments(args)
    apply_continue_from(args)
    args.advantage_estimator = "mopd"
    if args.mopd_metrics_dir is None:
        args.mopd_metrics_dir = str(Path(args.save or ".") / "metrics")
    return args


def check_config_and_checkpoints(args: Any) -> None:
    """Fail before any actor exists: the MOPD config against the parsed options (hooks import,
    environment set), the objective against slime's options (``dense`` is embedded-only, what
    ``topk`` cannot run with), and the student and teacher checkpoints the config and ``args``
    name (with ``topk``, K against the student's vocabulary)."""
    from dressage.training.checkpoints import (
        continued_checkpoint_problems,
        validate_mopd_checkpoints,
    )

    mopd, actor = mopd_args(args), actor_args(args)
    config = load_mopd_config(mopd.mopd_config)
    report = validate_mopd_run(config, args)
    report.problems += slime_objective_problems(args)
    topk = DEFAULT_MOPD_TOPK if mopd.mopd_topk is None else mopd.mopd_topk
    report.problems += validate_mopd_checkpoints(
        config,
        hf_checkpoint=actor.hf_checkpoint,
        ref_load=actor.ref_load,
        ckpt_step=actor.ref_ckpt_step,
        mopd_topk=topk if mopd.mopd_objective == "topk" else None,
    )
    if actor.continued:  # --dressage-continue-from, applied
        report.problems += continued_checkpoint_problems(
            actor.hf_checkpoint, actor.load, actor.ckpt_step
        )
    report.raise_if_failed("MOPD run")


@dataclass(frozen=True)
class _Run:
    """What every phase of the loop reads besides the two Ray handles."""

    loop: LoopArgs
    ray: Any
    num_rollout_per_epoch: int | None
    periodic: PeriodicAction
    """slime's ``should_run_periodic_action``."""

    @property
    def release_train(self) -> bool:
        return self.loop.release_train


def _update_weights(run: _Run, rollout_manager: Any, actor_model: Any, *, initial: bool) -> None:
    """slime's weight push: weights onloaded (an offloaded rollout not released), update, the
    optional first-push check, then the KV cache back."""
    loop, ray = run.loop, run.ray
    if loop.offload_rollout and not run.release_train:
        ray.get(rollout_manager.onload_weights.remote())
    actor_model.update_weights()
    if initial and loop.check_weight_update_equal:
        ray.get(rollout_manager.check_weights.remote(action="compare"))
    if loop.offload_rollout:
        ray.get(rollout_manager.onload_kv.remote())


def _save(run: _Run, rollout_manager: Any, actor_model: Any, rollout_id: int) -> None:
    loop = run.loop
    force_sync = run.release_train or rollout_id == loop.num_rollout - 1
    actor_model.save_model(rollout_id, force_sync=force_sync)
    if loop.rollout_global_dataset:  # the data source's position, to resume from
        run.ray.get(rollout_manager.save.remote(rollout_id))


def _step(run: _Run, rollout_manager: Any, actor_model: Any, rollout_id: int) -> dict[str, float]:
    """One rollout of slime's loop; returns its phase timings."""
    loop, ray = run.loop, run.ray
    if loop.eval_interval is not None and rollout_id == 0 and not loop.skip_eval_before_train:
        ray.get(rollout_manager.eval.remote(rollout_id))
    started = time.monotonic()
    rollout_data_ref = ray.get(rollout_manager.generate.remote(rollout_id))
    generated = time.monotonic()
    if loop.offload_rollout:
        ray.get(rollout_manager.offload.remote())
    if run.release_train:
        actor_model.create()
    ray.get(actor_model.async_train(rollout_id, rollout_data_ref))
    trained = time.monotonic()
    interval, per_epoch = loop.save_interval, run.num_rollout_per_epoch
    if run.release_train or run.periodic(rollout_id, interval, per_epoch, loop.num_rollout):
        _save(run, rollout_manager, actor_model, rollout_id)
    if not loop.offload_train:  # slime's offload_train(actor_trains) with no critic
        actor_model.clear_memory()
    _update_weights(run, rollout_manager, actor_model, initial=False)
    updated = time.monotonic()
    if run.periodic(rollout_id, loop.eval_interval, per_epoch):
        ray.get(rollout_manager.eval.remote(rollout_id))
    return {
        "time/generate_s": generated - started,
        "time/train_s": trained - generated,
        "time/update_weights_s": updated - trained,
        "time/step_s": time.monotonic() - started,
    }


def train(args: Any) -> None:
    """slime ``train.py``'s loop (docs/slime.md §6.1) with ``actor_cls`` set; see the module
    docstring for where it differs."""
    if actor_args(
        args
    ).use_critic:  # before any actor exists (check_config_and_checkpoints refuses ppo too)
        raise ValueError("--use-critic: MOPD trains no critic (its advantage is the teacher's)")
    import ray
    from slime.observability import logging_utils
    from slime.observability.logging_utils import finish_tracking, init_tracking
    from slime.ray.placement_group import (
        create_placement_groups,
        create_rollout_manager,
        create_training_models,
    )

    from dressage.training.metrics_sink import MetricsSink
    from dressage.training.mopd_actor import make_mopd_actor_cls

    logging_utils.configure_logger()
    pgs = create_placement_groups(args)
    keep_wandb_run(args)  # a resubmitted job logs to the W&B run it started
    init_tracking(args)
    rollout_manager, num_rollout_per_epoch = create_rollout_manager(args, pgs["rollout"])
    actor_model, critic_model = create_training_models(
        args, pgs, rollout_manager, actor_cls=make_mopd_actor_cls()
    )
    if critic_model is not None:  # refused above; a critic here means slime changed
        raise RuntimeError("MOPD trains no critic, but slime created one")
    # read after slime's setup, which sets num_rollout (from --num-epoch) and start_rollout_id
    # (from the loaded checkpoint)
    loop = loop_args(args)
    run = _Run(loop, ray, num_rollout_per_epoch, periodic_action())

    _update_weights(run, rollout_manager, actor_model, initial=True)
    if loop.num_rollout == 0 and loop.eval_interval is not None:  # slime's eval-only run
        ray.get(rollout_manager.eval.remote(rollout_id=0))
    sink = MetricsSink(Path(mopd_args(args).mopd_metrics_dir or ".") / "driver.jsonl")
    try:
        for rollout_id in range(loop.start_rollout_id, loop.num_rollout):
            sink.log(rollout_id, _step(run, rollout_manager, actor_model, rollout_id))
    finally:
        sink.close()
    ray.get(rollout_manager.dispose.remote())
    finish_tracking(args)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_mopd_args(argv)
        check_config_and_checkpoints(args)
    except (MopdConfigError, ContinueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
