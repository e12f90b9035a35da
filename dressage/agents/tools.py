"""The small environments the built-in agents work in: a calculator and a lookup table.

Each environment is a :class:`ToolEnvironment`: OpenAI tool specs (what the model is shown) and
an executor that turns one tool call into the text of its result. A call that cannot run (an
unknown tool, arguments that are not a JSON object, a missing key, an expression that is not
arithmetic) returns an ``error: ...`` text, as a real tool server would, so the model sees the
error and the agent goes on; nothing here raises into the agent loop.

* ``calculator``: evaluates ``+ - * / // % **`` and parentheses over numbers by walking the
  parsed AST (never ``eval``), with bounds on size, exponents and magnitudes;
* ``lookup``: answers ``lookup(key)`` from a table given in the prompt as
  ``Table: plum=70, kiwi=16. ...`` (or in the sample's ``metadata["table"]`` as a mapping).

``environment_for(task, prompt, metadata)`` picks the environment of a task name (the
datasets' ``metadata["task"]``); other tasks get no tools.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CALCULATOR_TOOL",
    "LOOKUP_TOOL",
    "CalculatorError",
    "ToolEnvironment",
    "calculate",
    "environment_for",
    "format_number",
    "parse_table",
]

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Return the value stored under a key of the task's table.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    },
}

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e15
MAX_EXPONENT = 64


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message says which part and why."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _checked(value: float | int) -> float | int:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"the result exceeds {MAX_MAGNITUDE:g}")
    return value


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"{node.value!r} is not a number")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError(f"the result exceeds {MAX_MAGNITUDE:g}") from None
    raise CalculatorError(f"{type(node).__name__} is not arithmetic")


def calculate(expression: str) -> float | int:
    """The value of an arithmetic expression; raises :class:`CalculatorError` otherwise."""
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot parse {text!r}: {exc.msg}") from None
    value = _evaluate(tree)
    if isinstance(value, complex):  # a negative base to a fractional power
        raise CalculatorError("the result is not a real number")
    return value


def format_number(value: float | int) -> str:
    """``28`` for 28.0, ``2.5`` for 2.5: integral values print without a decimal point."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


_TABLE = re.compile(r"Table:\s*(?P<body>.*?)(?:\.(?:\s|$)|\n|$)", re.IGNORECASE | re.DOTALL)
_ENTRY = re.compile(r"^\s*(?P<key>[^=,]+?)\s*=\s*(?P<value>[^,]+?)\s*$")


def parse_table(text: str) -> dict[str, str]:
    """``{"plum": "70", "kiwi": "16"}`` from ``"Table: plum=70, kiwi=16. ..."`` (empty if none)."""
    match = _TABLE.search(text)
    if match is None:
        return {}
    table = {}
    for item in match.group("body").split(","):
        entry = _ENTRY.match(item)
        if entry is not None:
            table[entry.group("key").lower()] = entry.group("value")
    return table


@dataclass
class ToolEnvironment:
    """Tool specs plus their executors; :meth:`call` never raises."""

    tools: dict[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)
    specs: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    errors: int = 0

    def call(self, name: str, arguments: str | Mapping[str, Any] | None) -> str:
        """The result text of one tool call (``error: ...`` when it cannot run)."""
        self.calls += 1
        try:
            fn = self.tools.get(name)
            if fn is None:
                raise ValueError(f"unknown tool {name!r}; available: {sorted(self.tools)}")
            return fn(_arguments(arguments))
        except ValueError as exc:  # CalculatorError and bad arguments: the model reads them
            self.errors += 1
            return f"error: {exc}"


def _arguments(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not JSON ({exc.msg}): {arguments[:80]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def _required(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"missing argument {name!r}")
    return str(value)


def _calculator(args: dict[str, Any]) -> str:
    return format_number(calculate(_required(args, "expression")))


def _lookup_in(table: dict[str, str]) -> Callable[[dict[str, Any]], str]:
    def lookup(args: dict[str, Any]) -> str:
        key = _required(args, "key").strip().strip("'\"").lower()
        if key not in table:
            raise ValueError(f"no key {key!r} in the table; keys: {sorted(table)}")
        return table[key]

    return lookup


def environment_for(
    task: str | None, prompt: str, metadata: Mapping[str, Any] | None = None
) -> ToolEnvironment:
    """The environment of ``task``: ``calculator``, ``lookup``, or none (no tools)."""
    if task == "calculator":
        return ToolEnvironment({"calculator": _calculator}, [CALCULATOR_TOOL])
    if task == "lookup":
        given = (metadata or {}).get("table")
        table = (
            {str(k).lower(): str(v) for k, v in given.items()}
            if isinstance(given, Mapping)
            else parse_table(prompt)
        )
        return ToolEnvironment({"lookup": _lookup_in(table)}, [LOOKUP_TOOL])
    return ToolEnvironment()
