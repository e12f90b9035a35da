"""The task-reward registry and the built-in final-answer rewards."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.reward.builtin import final_answer, normalize_text, parse_number
from dressage.reward.registry import get_reward, register_reward, registered_rewards
from dressage.types import Sample

pytestmark = pytest.mark.unit


def test_builtins_are_registered() -> None:
    assert {"calculator", "exact_match", "lookup"} <= set(registered_rewards())


def test_a_taken_name_cannot_be_reused_by_another_function() -> None:
    def first(args: Any, sample: Sample) -> float:
        return 1.0

    register_reward("test_registry_taken")(first)
    register_reward("test_registry_taken")(first)  # the same function again (a reload) is fine
    assert get_reward("test_registry_taken") is first

    def second(args: Any, sample: Sample) -> float:
        return 0.0

    with pytest.raises(ValueError, match="'test_registry_taken' is already registered by"):
        register_reward("test_registry_taken")(second)
    with pytest.raises(ValueError, match="non-empty task name"):
        register_reward("")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so it is \\boxed{\\frac{1}{2}} indeed", "\\frac{1}{2}"),
        ("Answer: 12\nthanks", "12"),
        ("first answer: 3. Final answer: **42**", "**42**"),
        ("we looked it up\n\n  Paris  \n", "Paris"),
        ("", ""),
    ],
)
def test_final_answer(text: str, answer: str) -> None:
    assert final_answer(text) == answer


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("1,024", 1024.0),
        ("$3.50", 3.5),
        ("3/4", 0.75),
        ("**-2**", -2.0),
        ("12%", 12.0),
        ("x", None),
        ("1/0", None),
        ("inf", None),
    ],
)
def test_parse_number(text: str, number: float | None) -> None:
    assert parse_number(text) == number


def test_normalize_text() -> None:
    assert normalize_text(' **"New   York".** ') == "new york"


@pytest.mark.parametrize(
    ("task", "response", "label", "reward"),
    [
        ("calculator", "Answer: 1,024", "1024", 1.0),
        ("calculator", "Answer: 1024.0000001", "1024", 1.0),
        ("calculator", "Answer: 1025", "1024", 0.0),
        ("calculator", "Answer: paris", "paris", 0.0),  # not a number: no match
        ("lookup", "Final answer: PARIS.", "Paris", 1.0),
        ("lookup", "Answer: Lyon", "Paris", 0.0),
        ("exact_match", "Answer: 0.50", "1/2", 1.0),
        ("exact_match", "Answer: New York", "new york", 1.0),
        ("exact_match", "Answer: York", "new york", 0.0),
    ],
)
def test_builtin_rewards(task: str, response: str, label: str, reward: float) -> None:
    sample = Sample(index=0, response=response, label=label)
    assert get_reward(task)(None, sample) == reward
