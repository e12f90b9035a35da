"""The project's group generation against slime's ``generate_and_rm_group``, side by side.

The embedded rollout and the partial-async rollout generate and score a prompt group with
``dressage.rollout.group_generation.generate_group``, a stand-in for slime's
``generate_and_rm_group`` (which needs SGLang's engines in its process). Here both run the same
hooks (``tests/real_slime/fake_hooks.py``) on copies of the same groups: single samples,
trajectories split into segments, ABORTED ones, samples that score themselves or name their own
reward function, finished samples from a partial rollout's buffer, and ``--group-rm``; they must
leave the same samples with the same rewards, after the same reward calls. The default sampling
parameters must be slime's too.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest \
        tests/real_slime/test_group_generation_parity.py
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from dressage.rollout.group_generation import generate_group, sampling_params_from_args
from tests.real_slime import fake_hooks

pytestmark = pytest.mark.unit


def _args(**over: Any) -> SimpleNamespace:
    from dressage.tiny import tiny_model_dir

    values: dict[str, Any] = dict(
        hf_checkpoint=str(tiny_model_dir()),
        custom_generate_function_path="tests.real_slime.fake_hooks.generate",
        custom_rm_path="tests.real_slime.fake_hooks.rm",
        group_rm=False,
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        rollout_sample_hook_path=None,
        sglang_server_concurrency=8,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        sglang_dp_size=None,
        rollout_temperature=0.7,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=64,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        n_samples_per_prompt=2,
        rollout_seed=1,
    )
    values.update(over)
    return SimpleNamespace(**values)


@pytest.fixture(scope="module", autouse=True)
def generate_state() -> Iterator[None]:
    """slime's generation state is a process-wide singleton (it loads the tokenizer): one for
    the module, dropped after it."""
    from slime.rollout import sglang_rollout
    from slime.utils.misc import SingletonMeta

    SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)
    yield
    SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)


def _group(*scripts: str, **extra: Any) -> list[Any]:
    from dressage.types import Sample

    group = []
    for i, script in enumerate(scripts):
        sample = Sample(
            index=i, group_index=0, prompt="q", tokens=[1, 2], metadata={"script": script}
        )
        for key, value in extra.get(script, {}).items():
            setattr(sample, key, value)
        group.append(sample)
    return group


def _view(group: list[Any]) -> list[Any]:
    def one(s: Any) -> Any:
        return (s.index, s.status.value, s.response, s.reward, s.tokens)

    return [[one(s) for s in item] if isinstance(item, list) else one(item) for item in group]


def _both(args: Any, group: list[Any]) -> tuple[Any, Any]:
    from slime.rollout.sglang_rollout import generate_and_rm_group

    params = sampling_params_from_args(args)
    fake_hooks.CALLS.clear()
    theirs = asyncio.run(generate_and_rm_group(args, copy.deepcopy(group), dict(params)))
    their_calls = sorted(map(repr, fake_hooks.CALLS))
    fake_hooks.CALLS.clear()
    ours = asyncio.run(generate_group(args, copy.deepcopy(group), dict(params)))
    our_calls = sorted(map(repr, fake_hooks.CALLS))
    return (_view(ours), our_calls), (_view(theirs), their_calls)


FINISHED = {"status": None, "response": "buffered", "reward": 0.5}

GROUPS = {
    "single samples": ("one", "one"),
    "a split trajectory": ("split", "one"),
    "an aborted segment": ("split_aborted", "split"),
    "an aborted sample": ("aborted", "one"),
    "self-scored": ("prescored", "one"),
}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_groups_generate_and_score_as_slimes(name: str) -> None:
    ours, theirs = _both(_args(), _group(*GROUPS[name]))
    assert ours == theirs


def test_a_samples_own_reward_function_wins_as_in_slime() -> None:
    group = _group("one", "one", one={"custom_rm_path": "tests.real_slime.fake_hooks.other_rm"})
    ours, theirs = _both(_args(), group)
    assert ours == theirs


def test_finished_buffer_samples_are_kept_as_in_slime() -> None:
    from dressage.types import Sample

    group = _group("one", "one")
    group[0].status, group[0].response, group[0].reward = Sample.Status.COMPLETED, "kept", 0.5
    ours, theirs = _both(_args(), group)
    assert ours == theirs


def test_group_rm_scores_the_whole_group_as_in_slime() -> None:
    ours, theirs = _both(_args(group_rm=True), _group("one", "prescored", "one"))
    assert ours == theirs


def test_default_sampling_parameters_are_slimes() -> None:
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.misc import SingletonMeta

    for over in ({}, {"rollout_top_p": 0.9, "rollout_stop": ["x"], "rollout_top_k": 5}):
        SingletonMeta._instances.pop(GenerateState, None)
        args = _args(**over)
        assert sampling_params_from_args(args) == GenerateState(args).sampling_params
    SingletonMeta._instances.pop(GenerateState, None)
