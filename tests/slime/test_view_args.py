"""The typed views of slime's ``args`` (dressage.slime.train_args, mopd_args, rollout_args):
defaults are slime's, a Namespace that lacks a flag reads as the default, and each field keeps
the coercion its hooks have always applied (``or`` falling through on 0, None and "")."""

from __future__ import annotations

import dataclasses
from argparse import Namespace
from collections.abc import Callable
from typing import Any

import pytest

from dressage.slime.mopd_args import MopdArgs, mopd_args
from dressage.slime.rollout_args import RolloutArgs, rollout_args
from dressage.slime.train_args import (
    ActorArgs,
    AdvantageArgs,
    LogProbArgs,
    OptimizerArgs,
    PolicyLossArgs,
    actor_args,
    advantage_args,
    log_prob_args,
    optimizer_args,
    policy_loss_args,
)
from tests.slime.slime_flag_defaults import DIFFERENT, SLIME_DEFAULTS

pytestmark = pytest.mark.unit

VIEWS: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "ActorArgs": (ActorArgs, actor_args),
    "OptimizerArgs": (OptimizerArgs, optimizer_args),
    "AdvantageArgs": (AdvantageArgs, advantage_args),
    "PolicyLossArgs": (PolicyLossArgs, policy_loss_args),
    "LogProbArgs": (LogProbArgs, log_prob_args),
    "MopdArgs": (MopdArgs, mopd_args),
    "RolloutArgs": (RolloutArgs, rollout_args),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_namespace_without_the_flags_reads_as_the_defaults(name: str) -> None:
    cls, read = VIEWS[name]
    assert read(Namespace()) == cls()
    assert read(object()) == cls()  # any object with attributes, none of them set


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_the_defaults_are_slimes(name: str) -> None:
    cls, read = VIEWS[name]
    slime = SLIME_DEFAULTS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(slime) <= fields, f"{name}: table names fields the view lacks"
    view = cls()
    for field, default in slime.items():
        if (name, field) not in DIFFERENT:
            assert getattr(view, field) == default, f"{name}.{field}"
    # slime's parsed defaults read as a Namespace without them, but where a hook reads an absent
    # flag otherwise (DIFFERENT): there the parsed default is read as it is
    parsed = read(Namespace(**slime))
    for field in slime:
        expected = getattr(view, field)
        if (name, field) in DIFFERENT and getattr(parsed, field) != expected:
            expected = slime[field]
        assert getattr(parsed, field) == expected, f"{name}.{field}"
    assert dataclasses.replace(parsed, **{f: getattr(view, f) for f in slime}) == view


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_are_frozen(name: str) -> None:
    cls, _ = VIEWS[name]
    field = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cls(), field, None)


def test_actor_args_coercions() -> None:
    view = actor_args(
        Namespace(
            seed="7",
            micro_batch_size=None,
            max_tokens_per_gpu="4096",
            context_parallel_size=0,
            log_probs_max_tokens="128",
            dressage_continue_state="/run/state.json",
            use_opd=1,
        )
    )
    assert view.seed == 7 and view.max_tokens_per_gpu == 4096
    assert view.micro_batch_size is None  # as given: the embedded schedule refuses it
    assert view.context_parallel_size == 1  # 0 or None read as 1
    assert view.log_probs_max_tokens == 128
    assert view.continued is True and view.use_opd is True
    assert actor_args(Namespace(dressage_continue_state="")).continued is False
    assert actor_args(Namespace(rollout_function_path=None)).rollout_function_path is None
    assert actor_args(Namespace(start_rollout_id=None)).start_rollout_id is None
    assert actor_args(Namespace(device=None)).device is None


def test_optimizer_args_coercions() -> None:
    view = optimizer_args(
        Namespace(
            clip_grad=0,
            min_lr=None,
            lr_warmup_iters=None,
            lr_decay_style="",
            lr_decay_iters=0,
            num_rollout="3",
            n_samples_per_prompt=0,
        )
    )
    assert view.clip_grad == 0.0  # 0: no clipping, not slime's 1.0
    assert view.min_lr == 0.0 and view.lr_warmup_iters == 0
    assert view.lr_decay_style == "constant"
    assert view.lr_decay_iters is None and view.num_rollout == 3
    assert view.n_samples_per_prompt == 1
    assert optimizer_args(Namespace(clip_grad=None)).clip_grad == 0.0
    assert optimizer_args(Namespace(lr_decay_iters="10")).lr_decay_iters == 10


def test_advantage_args_coercions() -> None:
    view = advantage_args(
        Namespace(kl_coef=None, opd_kl_coef=None, gamma="0.5", use_rollout_logprobs=True)
    )
    assert view.kl_coef == 0.0 and view.opd_kl_coef == 0.0 and view.gamma == 0.5
    assert view.student_key == "rollout_log_probs"
    assert AdvantageArgs().student_key == "log_probs"
    assert advantage_args(Namespace(opd_kl_coef=0)).opd_kl_coef == 0.0
    # as given, not defaulted (the estimator's error names it)
    assert advantage_args(Namespace(advantage_estimator=None)).advantage_estimator is None
    with pytest.raises(TypeError):
        advantage_args(Namespace(gamma=None))


def test_policy_loss_args_coercions() -> None:
    view = policy_loss_args(
        Namespace(entropy_coef=None, eps_clip="0.3", eps_clip_high="0.4", eps_clip_c=3)
    )
    assert view.entropy_coef == 0.0 and view.eps_clip == 0.3
    assert view.eps_clip_high == 0.4 and view.eps_clip_c == 3.0
    with pytest.raises(TypeError):
        policy_loss_args(Namespace(eps_clip=None))


def test_log_prob_args_coercions() -> None:
    assert log_prob_args(Namespace(rollout_temperature=0)).rollout_temperature == 1.0
    assert log_prob_args(Namespace(rollout_temperature=0.7)).rollout_temperature == 0.7
    for value, chunk in ((None, 0), (0, 0), (-1, 0), (-5, 0), (256, 256)):
        view = log_prob_args(Namespace(log_probs_chunk_size=value))
        assert view.chunk_tokens == chunk, value
    assert log_prob_args(Namespace(log_probs_chunk_size=0)).log_probs_chunk_size == -1


def test_mopd_args_coercions() -> None:
    view = mopd_args(
        Namespace(
            mopd_objective="",
            mopd_topk="8",
            mopd_forward_kl_weight=None,
            mopd_advantage_clip="2",
            rollout_top_p=0,
        )
    )
    assert view.mopd_objective == "sampled"
    assert view.mopd_topk == 8 and view.mopd_forward_kl_weight == 0.0
    assert view.mopd_advantage_clip == 2.0
    assert view.rollout_top_p == 0.0  # not 1.0: the top-k check refuses it
    assert mopd_args(Namespace(rollout_top_p=None)).rollout_top_p == 1.0
    assert mopd_args(Namespace(mopd_objective="bogus")).mopd_objective == "bogus"  # unchecked


def test_rollout_args_coercions() -> None:
    view = rollout_args(
        Namespace(
            rollout_temperature=0,
            rollout_top_p=0,
            rollout_top_k=0,
            rollout_batch_size=None,
            n_samples_per_prompt=0,
            sglang_server_concurrency=None,
            rollout_seed=None,
            rollout_sample_hook_path="a.b",
            dressage_async_groups_in_flight=0,
            dressage_async_max_groups_ahead="4",
            dressage_max_staleness="2",
            dressage_stale_policy=None,
        )
    )
    assert (view.rollout_temperature, view.rollout_top_p, view.rollout_top_k) == (1.0, 1.0, -1)
    assert view.rollout_batch_size == 1 and view.n_samples_per_prompt == 1
    assert view.sglang_server_concurrency == 512 and view.rollout_seed == 42
    assert view.rollout_sample_hook_path == ("a.b",)
    assert view.dressage_async_groups_in_flight is None
    assert view.dressage_async_max_groups_ahead == 4
    assert view.dressage_max_staleness == 2 and view.dressage_stale_policy == "drop"
    assert rollout_args(Namespace(rollout_seed=0)).rollout_seed == 0
    hooks = rollout_args(Namespace(rollout_sample_hook_path=["a.b", "c.d"]))
    assert hooks.rollout_sample_hook_path == ("a.b", "c.d")
    stop = ["</s>"]
    assert rollout_args(Namespace(rollout_stop=stop)).rollout_stop is stop  # as given


def test_loop_args_read_the_drivers_flags_with_slimes_defaults() -> None:
    from dressage.slime.args import LoopArgs, loop_args

    assert loop_args(Namespace(num_rollout=3)) == LoopArgs(num_rollout=3)
    assert LoopArgs(num_rollout=3).rollout_global_dataset  # slime's store_false flag: on
    critic = loop_args(Namespace(num_rollout=5, use_critic=True, num_critic_only_steps=2))
    assert [critic.actor_trains(i) for i in range(4)] == [False, False, True, True]
    plain = loop_args(Namespace(num_rollout=5, use_critic=False, num_critic_only_steps=2))
    assert plain.actor_trains(0)
    # slime's parser leaves the offload flags None until its validation sets them: off
    assert not loop_args(Namespace(num_rollout=1, offload_rollout=None)).offload_rollout
