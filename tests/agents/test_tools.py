"""The small environments: a calculator that never evals, a lookup table, errors as results."""

from __future__ import annotations

import json

import pytest

from dressage.agents.base import AgentTask
from dressage.agents.tasks import TASKS, make_instances
from dressage.agents.tools import (
    CalculatorError,
    calculate,
    environment_for,
    format_number,
    parse_table,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("22 + 6", 28),
        ("27 - 22 * 2", -17),
        ("(3 + 4) * 5", 35),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-3 ** 2", -9),
        ("2 ^ 10", 1024),
        ("6 × 7 ÷ 3", 14),
        ("1.5e3 % 7", 1500.0 % 7),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "Call is not arithmetic"),
        ("open", "Name is not arithmetic"),
        ("(1).real", "Attribute is not arithmetic"),
        ("[1, 2]", "List is not arithmetic"),
        ("'a' * 3", "'a' is not a number"),
        ("True + 1", "True is not a number"),
        ("1 / 0", "division by zero"),
        ("10 ** 100", "exponent 100 is larger"),
        ("9 ** 9 ** 9", "exponent 387420489 is larger"),
        ("99999999 * 99999999", "exceeds"),
        ("1 +", "cannot parse"),
        ("   ", "empty"),
        ("1+" * 150 + "1", "longer than 200"),
        ("(-8) ** 0.5", "not a real number"),
    ],
)
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        calculate(expression)


def test_numbers_print_like_answers() -> None:
    assert [format_number(v) for v in (28.0, 2.5, -5, 1e3)] == ["28", "2.5", "-5", "1000"]


def test_lookup_table_is_read_from_the_prompt() -> None:
    prompt = "Table: plum=70, Kiwi=16, mango = 74, melon=40. What is the value of kiwi?"
    assert parse_table(prompt) == {"plum": "70", "kiwi": "16", "mango": "74", "melon": "40"}
    assert parse_table("no table here") == {}


def test_tool_calls_return_results_or_error_texts_never_raise() -> None:
    calc = environment_for("calculator", "Compute 2 + 3.")
    assert [s["function"]["name"] for s in calc.specs] == ["calculator"]
    assert calc.call("calculator", '{"expression": "2 + 3"}') == "5"
    assert calc.call("calculator", {"expression": "2 * 3"}) == "6"
    assert calc.call("calculator", "{not json").startswith("error: arguments are not JSON")
    assert calc.call("calculator", "[1]") == "error: arguments must be a JSON object, got list"
    assert calc.call("calculator", "{}") == "error: missing argument 'expression'"
    assert calc.call("calculator", '{"expression": "1/0"}') == "error: division by zero"
    assert calc.call("lookup", '{"key": "a"}').startswith("error: unknown tool 'lookup'")
    assert (calc.calls, calc.errors) == (7, 5)

    table = environment_for("lookup", "Table: fig=44, olive=77. What is fig?")
    assert table.call("lookup", '{"key": "FIG"}') == "44"
    assert table.call("lookup", '{"key": "\\"olive\\""}') == "77"
    assert table.call("lookup", '{"key": "pear"}') == (
        "error: no key 'pear' in the table; keys: ['fig', 'olive']"
    )
    given = environment_for("lookup", "no table", {"table": {"Sun": 1}})
    assert given.call("lookup", '{"key": "sun"}') == "1"
    assert environment_for("exact_match", "anything").specs == []


@pytest.mark.parametrize("task", TASKS)
def test_task_instances_are_deterministic_and_solved_by_their_tool_call(task: str) -> None:
    first, again = make_instances(task, 12, seed=3), make_instances(task, 12, seed=3)
    assert first == again and first != make_instances(task, 12, seed=4)
    for instance in first:
        env = environment_for(task, instance.prompt)
        assert env.call(instance.tool, json.dumps(instance.arguments)) == instance.label
        assert instance.prompt.endswith("Reply with the number only.")


def test_agent_task_round_trips_as_json_and_splits_request_fields() -> None:
    task = AgentTask(
        prompt="Compute 2 + 3.",
        task="calculator",
        sampling={"max_tokens": 8, "temperature": 0.5, "top_k": 4, "stop_token_ids": [1]},
        metadata={"table": {"a": 1}},
    )
    assert AgentTask.from_json(task.to_json()) == task
    assert AgentTask.from_json('"just a prompt"').prompt == "just a prompt"
    options = task.request_options()
    assert options["max_tokens"] == 8 and options["temperature"] == 0.5
    assert options["extra_body"] == {
        "chat_template_kwargs": {"enable_thinking": False},
        "top_k": 4,
        "stop_token_ids": [1],
    }
    with pytest.raises(ValueError, match="unknown agent task fields \\['colour'\\]"):
        AgentTask.from_json('{"prompt": "x", "colour": "red"}')
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        AgentTask(prompt="x", max_turns=0)
    messages = [{"role": "user", "content": "hi"}]
    assert AgentTask(prompt=messages).initial_messages() == messages
    assert AgentTask(prompt=messages).prompt_text == "hi"
