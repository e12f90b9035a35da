"""The ray backend's entrypoint: slime's command line and the proxy started beside it.

slime does not run here: a stand-in interpreter takes the place of the slime image's python and
records what it was given, while the real proxy runs beside it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from dressage.config.job import ClusterOptions, JobOptions
from dressage.config.mopd import MOPD_HOOKS, MopdConfigError
from dressage.config.run import TrainRunConfig
from dressage.jobs.cluster import cluster_plan, grpo_loss_flags, optimizer_flags, rollout_flags
from dressage.jobs.train import main
from dressage.tiny.checkpoints import resolve_checkpoint
from tests.helpers import REPO, free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("embedded_checkpoints")]

EMBEDDED = str(REPO / "configs/mopd/embedded.json")
STUDENT = json.loads(Path(EMBEDDED).read_text())["student"]["hf_checkpoint"]


def _run(tmp_path: Path, objective: str = "mopd", **advanced: object) -> TrainRunConfig:
    return TrainRunConfig(
        objective=objective,  # type: ignore[arg-type]
        mopd_config=EMBEDDED,
        student=STUDENT,
        engine_url=None,
        proxy_url=None,
        output_dir=str(tmp_path / "out"),
        num_steps=5,
        seed=11,
        rollout_batch_size=16,
        backend="ray",
        advanced=dict(advanced),
    )


def _plan(run: TrainRunConfig, **cluster: object):  # type: ignore[no-untyped-def]
    options = JobOptions.model_validate(run.advanced)
    return cluster_plan(
        run.model_copy(update={"student": str(resolve_checkpoint(run.student))}),
        cluster=ClusterOptions.model_validate(cluster),
        max_response_len=256,
        temperature=1.0,
        n_samples_per_prompt=4,
        partial_rollout=True,
        num_steps_per_rollout=options.num_steps_per_rollout,
        mopd_advantage_clip=None,
        mopd_objective=options.mopd_objective,
        mopd_topk=options.mopd_topk,
        mopd_forward_kl_weight=options.mopd_forward_kl_weight,
        host="10.0.0.7",
        environ={},
        optimizer=[
            *optimizer_flags(JobOptions.model_validate(run.advanced)),
            *grpo_loss_flags(JobOptions.model_validate(run.advanced)),
        ],
        rollout=rollout_flags(JobOptions.model_validate(run.advanced)),
        save_interval=options.save_interval,
        continue_from=options.continue_from,
    )


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, flag
    return argv[argv.index(flag) + 1]


def test_mopd_runs_the_validated_slime_command_with_the_proxy_on_this_node(tmp_path: Path) -> None:
    plan = _plan(_run(tmp_path), tp_size=2, actor_num_gpus_per_node=4, proxy_port=18123)
    assert plan.argv[:3] == ["python3", "-m", "dressage.training.mopd_train"]
    assert _value(plan.argv, "--dressage-proxy-url") == "http://10.0.0.7:18123"
    assert _value(plan.argv, "--sglang-router-ip") == "10.0.0.7"
    assert _value(plan.argv, "--tensor-model-parallel-size") == "2"
    assert _value(plan.argv, "--num-rollout") == "5"
    assert _value(plan.argv, "--n-samples-per-prompt") == "1"  # MOPD: one per prompt
    assert _value(plan.argv, "--seed") == _value(plan.argv, "--rollout-seed") == "11"
    resolved = Path(plan.env["DRESSAGE_MOPD_CONFIG"])
    assert plan.env["DRESSAGE_MOPD_TEACHER_CONFIG"] == str(resolved)  # for an older driver
    assert resolved.is_file() and _value(plan.argv, "--mopd-config") == str(resolved)
    assert _value(plan.proxy_argv, "--engine-url") == "http://10.0.0.7:30000"
    assert _value(plan.proxy_argv, "--host") == "10.0.0.7"
    assert "--record-token-versions" in plan.proxy_argv


@pytest.mark.parametrize("objective", ["mopd", "grpo"])
def test_the_learning_rate_and_its_schedule_reach_slime(tmp_path: Path, objective: str) -> None:
    run = _run(tmp_path, objective, learning_rate=2e-6, lr_decay_style="cosine", min_lr=1e-7,
               lr_warmup_iters=3)  # fmt: skip
    plan = _plan(run)
    assert _value(plan.argv, "--lr") == "2e-06"
    assert _value(plan.argv, "--lr-decay-style") == "cosine"
    assert _value(plan.argv, "--min-lr") == "1e-07"
    assert _value(plan.argv, "--lr-warmup-iters") == "3"
    # a flag in cluster.extra_args comes later on the line, so slime's parser takes it
    plan = _plan(run, extra_args=["--lr", "5e-6"])
    at = [k for k, a in enumerate(plan.argv) if a == "--lr"]
    assert len(at) == 2 and plan.argv[at[-1] + 1] == "5e-6"


@pytest.mark.parametrize("objective", ["mopd", "grpo"])
def test_both_commands_save_periodically_and_load_where_they_save(
    tmp_path: Path, objective: str
) -> None:
    """A resubmitted job continues from slime's latest checkpoint (tests/real_slime checks the
    folder against slime's own tracker logic and rollout-id arithmetic)."""
    checkpoints = str(tmp_path / "out" / "checkpoints")
    plan = _plan(_run(tmp_path, objective))
    assert _value(plan.argv, "--save") == _value(plan.argv, "--load") == checkpoints
    assert _value(plan.argv, "--save-interval") == str(JobOptions().save_interval) == "10"
    plan = _plan(_run(tmp_path, objective, save_interval=2))
    assert _value(plan.argv, "--save-interval") == "2"


@pytest.mark.parametrize("objective", ["mopd", "grpo"])
def test_both_commands_can_continue_an_earlier_runs_checkpoint(
    tmp_path: Path, objective: str
) -> None:
    """``continue_from`` reaches both drivers as --dressage-continue-from (a file:// URL as
    the folder it names); without it the flag is absent."""
    earlier = tmp_path / "earlier" / "checkpoints"
    assert "--dressage-continue-from" not in _plan(_run(tmp_path, objective)).argv
    for value in (str(earlier), earlier.as_uri()):
        plan = _plan(_run(tmp_path, objective, continue_from=value))
        assert _value(plan.argv, "--dressage-continue-from") == str(earlier)


def test_grpo_runs_the_paused_async_driver_over_the_partial_rollout(tmp_path: Path) -> None:
    plan = _plan(_run(tmp_path, objective="grpo"), extra_args=["--num-layers", "2"])
    assert plan.argv[:3] == ["python3", "-m", "dressage.training.train_async_with_rollout_pause"]
    assert _value(plan.argv, "--advantage-estimator") == "grpo"
    assert _value(plan.argv, "--n-samples-per-prompt") == "4"
    assert _value(plan.argv, "--global-batch-size") == "64"
    assert "--num-steps-per-rollout" not in plan.argv  # one optimizer step per rollout
    assert _value(plan.argv, "--rollout-function-path").endswith("generate_rollout_partial_async")
    for attr in ("custom_generate_function_path", "custom_rm_path", "data_source_path"):
        assert _value(plan.argv, "--" + attr.replace("_", "-")) == MOPD_HOOKS[attr]
    assert _value(plan.argv, "--num-layers") == "2"
    assert "--colocate" in plan.argv  # the same layout flags as the MOPD builder
    assert plan.env["DRESSAGE_MOPD_CONFIG"] == EMBEDDED
    assert plan.env["DRESSAGE_MOPD_TEACHER_CONFIG"] == EMBEDDED  # for an older driver
    assert not [a for a in plan.argv if a.startswith("--dressage-async") or "stale" in a]


def test_the_partial_rollout_bounds_reach_the_grpo_driver(tmp_path: Path) -> None:
    bounds = {"max_staleness": 2, "stale_policy": "mask", "max_groups_ahead": 32}
    plan = _plan(_run(tmp_path, objective="grpo", groups_in_flight=8, **bounds))
    assert _value(plan.argv, "--dressage-max-staleness") == "2"
    assert _value(plan.argv, "--dressage-stale-policy") == "mask"
    assert _value(plan.argv, "--dressage-async-groups-in-flight") == "8"
    assert _value(plan.argv, "--dressage-async-max-groups-ahead") == "32"


def test_grpos_kl_and_entropy_terms_and_group_filter_reach_slime(tmp_path: Path) -> None:
    filter_path = "dressage.rollout.filters.nonzero_reward_std"
    plan = _plan(
        _run(tmp_path, objective="grpo", kl_loss_coef=0.05, entropy_coef=0.001,
             dynamic_sampling_filter=filter_path)
    )  # fmt: skip
    assert _value(plan.argv, "--dynamic-sampling-filter-path") == filter_path
    assert "--use-kl-loss" in plan.argv
    assert _value(plan.argv, "--kl-loss-coef") == "0.05"
    assert _value(plan.argv, "--kl-loss-type") == "low_var_kl"
    assert _value(plan.argv, "--entropy-coef") == "0.001"
    plain = _plan(_run(tmp_path, objective="grpo"))
    assert not {"--use-kl-loss", "--kl-loss-coef", "--entropy-coef"} & set(plain.argv)


def test_the_mopd_objective_and_its_top_k_reach_slime(tmp_path: Path) -> None:
    default = _plan(_run(tmp_path)).argv
    assert _value(default, "--mopd-objective") == "topk"  # the cluster default
    assert "--mopd-topk" not in default  # slime's side falls back to DEFAULT_MOPD_TOPK
    sampled = _plan(_run(tmp_path, mopd_objective="sampled")).argv
    assert _value(sampled, "--mopd-objective") == "sampled"
    run = _run(tmp_path, mopd_objective="topk", mopd_topk=8, mopd_forward_kl_weight=0.5)
    plan = _plan(run)
    assert _value(plan.argv, "--mopd-objective") == "topk"
    assert _value(plan.argv, "--mopd-topk") == "8"
    assert _value(plan.argv, "--mopd-forward-kl-weight") == "0.5"


def test_topk_beside_allgather_cp_is_refused_before_slime_starts(tmp_path: Path) -> None:
    run = _run(tmp_path, mopd_objective="topk")
    with pytest.raises(MopdConfigError, match="option --allgather-cp: --mopd-objective topk"):
        _plan(run, extra_args=["--allgather-cp"])


def test_the_entrypoint_serves_the_proxy_while_slime_runs_and_stops_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "slime.json"
    fake = tmp_path / "python3"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, httpx\n"
        "url = sys.argv[sys.argv.index('--dressage-proxy-url') + 1]\n"
        "health = httpx.get(url + '/health').status_code\n"
        "denied = httpx.get(url + '/v1/rollout/pause_state').status_code\n"
        f"json.dump({{'argv': sys.argv[1:], 'health': health, 'denied': denied,\n"
        "    'key': bool(os.environ.get('DRESSAGE_PROXY_ADMIN_KEY')),\n"
        "    'config': os.environ.get('DRESSAGE_MOPD_CONFIG')},\n"
        f"    open({str(record)!r}, 'w'))\n"
        "sys.exit(7)\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    port = free_port()
    run = _run(tmp_path, cluster={"python": str(fake), "proxy_port": port, "router_port": 9})
    path = run.write(tmp_path / "run.json")
    monkeypatch.setenv("DRESSAGE_PROXY_HOST", "127.0.0.1")
    monkeypatch.setenv("DRESSAGE_PROXY_ADMIN_KEY", "cluster-admin-key")
    assert main(["--run-config", str(path)]) == 7  # slime's exit status is the job's
    seen = json.loads(record.read_text())
    assert seen["argv"][:2] == ["-m", "dressage.training.mopd_train"]
    assert seen["health"] == 200 and seen["denied"] == 401  # control endpoints need the key
    assert seen["key"] and seen["config"] and os.path.isfile(seen["config"])
    with socket.socket() as sock:  # the proxy is gone
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_steps_per_rollout_reach_slime_with_the_batch_it_checks(tmp_path: Path) -> None:
    # slime asserts global_batch_size == rollout_batch_size x n // num_steps_per_rollout
    plan = _plan(_run(tmp_path, objective="grpo", num_steps_per_rollout=4))
    assert _value(plan.argv, "--num-steps-per-rollout") == "4"
    assert _value(plan.argv, "--global-batch-size") == "16"
    samples = int(_value(plan.argv, "--rollout-batch-size")) * 4  # 4 samples per prompt
    assert samples // int(_value(plan.argv, "--num-steps-per-rollout")) == 16
