"""The training job on a Ray cluster: RUN.json to slime's command line, the proxy beside it.

    python -m dressage.jobs.train --run-config RUN.json          # RUN.json: "backend": "ray"

The training DAGs submit this entrypoint as a Ray job (the slime image runs it on the head
node). It:

1. starts the recording proxy on this node, bound to the node's cluster address (Ray's node IP,
   or ``DRESSAGE_PROXY_HOST``) at ``cluster.proxy_port``, in front of the SGLang router address
   slime is told to use (``--sglang-router-ip``/``--sglang-router-port``; the proxy retries until
   slime's engines are up). The admin key comes from ``DRESSAGE_PROXY_ADMIN_KEY``, which the DAG
   passes as a secret in the job's runtime environment, so every rollout worker has it too;
2. builds slime's command line: MOPD through the one validated builder
   (:func:`dressage.launch.slime_command.build_mopd_job`, synchronous
   ``dressage.training.mopd_train``); GRPO as the paused async driver
   (``dressage.training.train_async_with_rollout_pause``) over the partial-async rollout and the
   black-box dispatch. Both get ``--dressage-proxy-url``;
3. runs it in the foreground, then stops the proxy; its exit status is the job's.

``advanced.cluster`` in RUN.json (:class:`~dressage.config.job.ClusterOptions`) carries the
parallelism, GPUs, W&B and any further slime/Megatron flags (the model architecture, the
optimizer).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

import dressage.config.proxy  # noqa: F401  (declares DRESSAGE_PROXY_HOST)
from dressage.config.env import env_given
from dressage.config.job import ClusterOptions, JobOptions, optimizer_batch
from dressage.config.mopd import MOPD_HOOKS
from dressage.config.mopd_path import mopd_config_env
from dressage.config.run import ClusterLayout, MopdObjective, MopdRunConfig, TrainRunConfig
from dressage.health import wait_healthy
from dressage.launch.slime_command import layout_flags

__all__ = [
    "ClusterPlan",
    "cluster_plan",
    "grpo_loss_flags",
    "optimizer_flags",
    "rollout_flags",
    "run_on_cluster",
]

GRPO_DRIVER = "dressage.training.train_async_with_rollout_pause"
PARTIAL_ASYNC_ROLLOUT = "dressage.rollout.partial_async_rollout.generate_rollout_partial_async"
ADMIN_KEY_ENV = "DRESSAGE_PROXY_ADMIN_KEY"


class ClusterPlan(BaseModel):
    """What :func:`run_on_cluster` runs: the proxy, then slime's command with its environment."""

    model_config = ConfigDict(frozen=True)

    proxy_argv: list[str]
    proxy_url: str
    argv: list[str]
    env: dict[str, str] = Field(repr=False)
    """Added to the job's environment (the resolved MOPD config, forwarded keys)."""


def node_address() -> str:
    """This node's address on the cluster network."""
    explicit = env_given("DRESSAGE_PROXY_HOST")  # the proxy's host, when set to one
    if explicit:
        return explicit
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - no Ray here: the hostname's address
        return socket.gethostbyname(socket.gethostname())


def optimizer_flags(options: JobOptions) -> list[str]:
    """The run's learning rate and schedule as slime's (Megatron's) flags."""
    return [
        "--lr", repr(options.learning_rate),
        "--lr-decay-style", options.lr_decay_style,
        "--min-lr", repr(options.min_lr),
        "--lr-warmup-iters", str(options.lr_warmup_iters),
    ]  # fmt: skip


def grpo_loss_flags(options: JobOptions) -> list[str]:
    """The GRPO loss's extra terms and its group filter as slime's flags (the ones set)."""
    flags: list[str] = []
    if options.kl_loss_coef:
        flags += ["--use-kl-loss", "--kl-loss-coef", repr(options.kl_loss_coef)]
        flags += ["--kl-loss-type", options.kl_loss_type]
    if options.entropy_coef:
        flags += ["--entropy-coef", repr(options.entropy_coef)]
    if options.dynamic_sampling_filter:
        flags += ["--dynamic-sampling-filter-path", options.dynamic_sampling_filter]
    return flags


def rollout_flags(options: JobOptions) -> list[str]:
    """The run's partial-rollout bounds as the paused async driver's flags (the ones set)."""
    bounded = options.max_staleness is not None
    values = {
        "--dressage-max-staleness": options.max_staleness,
        "--dressage-stale-policy": options.stale_policy if bounded else None,
        "--dressage-async-groups-in-flight": options.groups_in_flight,
        "--dressage-async-max-groups-ahead": options.max_groups_ahead,
    }
    return [x for flag, v in values.items() if v is not None for x in (flag, str(v))]


def cluster_plan(
    run: TrainRunConfig,
    *,
    cluster: ClusterOptions,
    max_response_len: int,
    temperature: float,
    n_samples_per_prompt: int,
    partial_rollout: bool,
    num_steps_per_rollout: int,
    mopd_advantage_clip: float | None,
    mopd_objective: MopdObjective,
    mopd_topk: int | None,
    mopd_forward_kl_weight: float,
    host: str,
    environ: Mapping[str, str],
    optimizer: Sequence[str] = (),
    rollout: Sequence[str] = (),
    save_interval: int | None = None,
    continue_from: str | None = None,
) -> ClusterPlan:
    """Validate and build (raises :class:`~dressage.config.mopd.MopdConfigError` for MOPD).
    ``optimizer``: slime flags (:func:`optimizer_flags`) placed before ``cluster.extra_args``,
    which can still override them; ``rollout``: the partial rollout's (:func:`rollout_flags`),
    for GRPO with partial rollout (MOPD's driver runs slime's own rollout); ``save_interval``:
    slime's ``--save-interval`` (default: once, after the last step). Both commands save to and
    load from ``output_dir/checkpoints``, so the same job submitted again resumes.
    ``continue_from``: an earlier run's slime checkpoint (a folder or a ``file://`` URL) this
    run starts from when it has none of its own (``--dressage-continue-from``,
    :mod:`dressage.slime.continue_from`)."""
    out = Path(run.output_dir)
    proxy_url = f"http://{host}:{cluster.proxy_port}"
    router = ["--sglang-router-ip", host, "--sglang-router-port", str(cluster.router_port)]
    proxy_argv = [sys.executable, "-m", "dressage.proxy.server"]
    proxy_argv += ["--engine-url", f"http://{host}:{cluster.router_port}"]
    proxy_argv += ["--host", host, "--port", str(cluster.proxy_port)]
    proxy_argv += ["--store-dir", str(out / "proxy-store"), "--tokenizer-path", run.student]
    if partial_rollout:
        proxy_argv += ["--dressage-partial-rollout", "--record-token-versions"]
    tail = [*router, "--dressage-proxy-url", proxy_url]
    if continue_from:
        from dressage.slime.continue_from import CONTINUE_FLAG
        from dressage.training.embedded.checkpoint import checkpoint_location

        tail += [CONTINUE_FLAG, str(checkpoint_location(continue_from))]
    if run.objective == "mopd":
        from dressage.launch.slime_command import build_mopd_job, write_job_files

        mopd_run = MopdRunConfig(
            mopd_config=run.mopd_config,
            output_dir=str(out),
            hf_checkpoint=run.student,
            num_rollout=run.num_steps,
            save_interval=save_interval or run.num_steps,
            rollout_batch_size=run.rollout_batch_size,
            rollout_max_response_len=max_response_len,
            rollout_temperature=temperature,
            seed=run.seed,
            rollout_seed=run.seed,
            mopd_advantage_clip=mopd_advantage_clip,
            mopd_objective=mopd_objective,
            mopd_topk=mopd_topk,
            mopd_forward_kl_weight=mopd_forward_kl_weight,
            **cluster.model_dump(include=set(ClusterLayout.model_fields) - {"extra_args"}),
            extra_args=[*optimizer, *cluster.extra_args, *tail],
        )
        job = build_mopd_job(mopd_run, environ=environ)
        write_job_files(job)
        return ClusterPlan(proxy_argv=proxy_argv, proxy_url=proxy_url, argv=job.argv, env=job.env)
    n, rbs = n_samples_per_prompt, run.rollout_batch_size
    argv = [cluster.python, "-m", GRPO_DRIVER, "--hf-checkpoint", run.student]
    # --load at the save folder: a resubmitted job continues from slime's latest checkpoint
    # (model, optimizer, rollout id) and the data source's saved position; with no checkpoint
    # there yet slime starts from --ref-load (cluster.extra_args) as before.
    argv += ["--save", str(out / "checkpoints"), "--load", str(out / "checkpoints")]
    argv += ["--save-interval", str(save_interval or run.num_steps)]
    argv += layout_flags(cluster)
    argv += ["--num-rollout", str(run.num_steps), "--update-weights-interval", "1"]
    argv += ["--rollout-batch-size", str(rbs), "--n-samples-per-prompt", str(n)]
    argv += ["--global-batch-size", str(optimizer_batch(rbs * n, num_steps_per_rollout))]
    if num_steps_per_rollout != 1:  # slime checks the two agree
        argv += ["--num-steps-per-rollout", str(num_steps_per_rollout)]
    argv += ["--rollout-max-response-len", str(max_response_len)]
    argv += ["--rollout-temperature", str(temperature)]
    argv += ["--seed", str(run.seed), "--rollout-seed", str(run.seed)]
    argv += ["--advantage-estimator", "grpo", "--loss-type", "policy_loss"]
    if partial_rollout:
        argv += ["--rollout-function-path", PARTIAL_ASYNC_ROLLOUT, *rollout]
    for attr in (
        "data_source_path",
        "custom_generate_function_path",
        "custom_rm_path",
        "custom_convert_samples_to_train_data_path",
        "custom_reward_post_process_path",
    ):
        argv += ["--" + attr.replace("_", "-"), MOPD_HOOKS[attr]]
    argv += [*optimizer, *cluster.extra_args, *tail]
    # The data source reads its datasets from the MOPD JSON (teachers unused by GRPO).
    env = mopd_config_env(Path(run.mopd_config).resolve())
    return ClusterPlan(proxy_argv=proxy_argv, proxy_url=proxy_url, argv=argv, env=env)


def run_on_cluster(plan: ClusterPlan, *, ready_timeout_s: float = 300.0) -> int:
    """Start the proxy, run slime's command to its end, stop the proxy; slime's exit status."""
    if not os.environ.get(ADMIN_KEY_ENV):
        raise ValueError(f"{ADMIN_KEY_ENV} is not set (the DAG passes the proxy's admin key)")
    env = {**os.environ, **plan.env}
    print(f"proxy: {plan.proxy_url}", flush=True)
    proxy = subprocess.Popen(plan.proxy_argv, env=env)
    try:
        wait_healthy(
            plan.proxy_url,
            ready_timeout_s,
            name="the proxy",
            alive=lambda: proxy.poll() is None,
            interval_s=0.5,
        )
        print("slime: " + shlex.join(plan.argv), flush=True)  # keys travel in env only
        return subprocess.call(plan.argv, env=env)
    finally:
        proxy.terminate()
        try:
            proxy.wait(30)
        except subprocess.TimeoutExpired:
            proxy.kill()
