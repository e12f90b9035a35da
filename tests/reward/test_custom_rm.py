"""custom_rm: slime's reward hook, anchors only, over the task registry."""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dressage.reward.custom_rm import custom_rm
from dressage.rollout.multi_segment import mark_aborted_no_grad
from dressage.types import Sample
from tests.rollout.factories import slime_args, template, trajectory

pytestmark = pytest.mark.unit


def _run(args: Any, item: Any) -> Any:
    return asyncio.run(custom_rm(args, item))


def _siblings(answer: str = "Answer: 4", n: int = 3, index: int = 0) -> list[Sample]:
    samples = trajectory(slime_args(), template(index, 0), [1] * n)
    samples[-1].response = answer
    return samples


def test_is_a_coroutine_function_with_slimes_call_shape() -> None:
    assert inspect.iscoroutinefunction(custom_rm)
    params = list(inspect.signature(custom_rm).parameters.values())
    assert [p.name for p in params] == ["args", "sample_or_samples", "kwargs"]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD


def test_a_single_anchor_is_scored_and_a_sibling_is_not() -> None:
    siblings = _siblings()
    assert _run(slime_args(), siblings[-1]) == 1.0
    assert _run(slime_args(), siblings[0]) == 0.0
    siblings[-1].response = "Answer: 5"
    assert _run(slime_args(), siblings[-1]) == 0.0


def test_lists_come_back_in_their_shape() -> None:
    right, wrong = _siblings(index=0), _siblings("\\boxed{5}", n=2, index=1)
    assert _run(slime_args(), right) == [0.0, 0.0, 1.0]
    assert _run(slime_args(), [right, wrong]) == [[0.0, 0.0, 1.0], [0.0, 0.0]]


def test_aborted_and_no_grad_samples_keep_their_reward() -> None:
    [anchor] = _siblings(n=1)
    anchor.status = Sample.Status.ABORTED
    assert _run(slime_args(), anchor) is None
    failed = mark_aborted_no_grad(template(3, 0), reason="timeout")
    assert _run(slime_args(), failed) == 0.0


def test_plain_slime_samples_are_anchors() -> None:
    plain = Sample(
        index=0, response="the answer: 1,024", label="1024", metadata={"task": "calculator"}
    )
    assert _run(slime_args(), plain) == 1.0
    plain.metadata = {"rm_type": "lookup"}
    assert _run(slime_args(), plain) == 0.0  # "1,024" is not the text "1024"
    plain.metadata = {}
    assert _run(slime_args(rm_type="exact_match"), plain) == 1.0


def test_reward_modules_are_imported_and_may_be_async() -> None:
    args = slime_args(reward_modules="tests.reward.reward_plugin, ")
    [anchor] = _siblings("four", n=1)
    anchor.metadata["task"] = "test_length_parity"
    assert _run(args, anchor) == 1.0
    anchor.metadata["task"] = "test_dict"
    assert _run(args, anchor) == {"score": 0.5, "format": 1.0}
    anchor.metadata["task"] = "test_bad_type"
    with pytest.raises(TypeError, match="sample index=0 .*field=reward: task 'test_bad_type'"):
        _run(args, anchor)


def test_reward_modules_from_the_mopd_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "teachers": {"t": {"load": str(tmp_path)}},
        "datasets": [
            {
                "name": "d",
                "path": "d.jsonl",
                "teacher_id": "t",
                "weight": 1.0,
                "agent_mode": "blackbox",
            }
        ],
        "reward_modules": ["tests.reward.reward_plugin"],
    }
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", str(tmp_path / "mopd.json"))
    [anchor] = _siblings("abc", n=1)
    anchor.metadata["task"] = "test_length_parity"
    assert _run(SimpleNamespace(), anchor) == 0.0


def test_unknown_or_missing_task_and_missing_label_fail() -> None:
    [anchor] = _siblings(n=1)
    anchor.metadata["task"] = "no_such_task"
    with pytest.raises(KeyError, match="no reward registered for task 'no_such_task'"):
        _run(slime_args(), anchor)
    anchor.metadata.pop("task")
    with pytest.raises(ValueError, match="sample index=0 .*field=metadata.task"):
        _run(slime_args(), anchor)
    anchor.metadata["task"], anchor.label = "calculator", None
    with pytest.raises(ValueError, match="sample index=0 .*field=label"):
        _run(slime_args(), anchor)
    with pytest.raises(ImportError, match="reward module 'no.such.module'"):
        _run(slime_args(reward_modules=["no.such.module"]), anchor)
