"""tests/slime/slime_flag_defaults.py (the defaults the typed views in ``dressage.slime`` are
checked against) against slime's own parser source at ``SLIME_ROOT``: every flag named there is
one of slime's options, with that default."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tests.slime.slime_flag_defaults import SLIME_DEFAULTS

pytestmark = pytest.mark.unit

_ACTION_DEFAULTS = {"store_true": False, "store_false": True}


def _parser_defaults(root: Path) -> dict[str, list[Any]]:
    """``--flag -> [default, ...]`` over every ``add_argument``/``reset_arg`` call of slime's
    ``arguments.py`` files (a flag may be declared more than once)."""
    found: dict[str, list[Any]] = {}
    for path in sorted((root / "slime").rglob("arguments.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            flags = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            flags = [f for f in flags if f.startswith("--")]
            if not flags:
                continue
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            if "default" in keywords:
                try:
                    default = ast.literal_eval(keywords["default"])
                except ValueError:
                    continue  # computed: not a literal
            else:
                action = keywords.get("action")
                name = action.value if isinstance(action, ast.Constant) else None
                default = _ACTION_DEFAULTS.get(str(name))
            for flag in flags:
                found.setdefault(flag, []).append(default)
    return found


@pytest.mark.parametrize("view", sorted(SLIME_DEFAULTS))
def test_the_views_slime_defaults_are_slimes_parser_defaults(
    view: str, slime_checkout: Path
) -> None:
    parsed = _parser_defaults(slime_checkout)
    problems = []
    for field, default in SLIME_DEFAULTS[view].items():
        flag = "--" + field.replace("_", "-")
        if flag not in parsed:
            problems.append(f"{flag}: not one of slime's options")
        elif default not in parsed[flag]:
            problems.append(f"{flag}: slime's default is {parsed[flag]}, the table {default!r}")
    assert not problems, f"{view}: " + "; ".join(problems)
