"""slime's plug-in contract as data (``tests/contracts/slime.json``), for the contract tests.

The JSON holds what the project's slime-facing code relies on at the reference commit: the
names it imports from slime, each hook's call site and call shape, ``Sample``'s fields, the
train_data keys of slime's default converter and of its DP split, and the methods (with their
parameters) of slime's actor, ``TensorBackuper``, ``RayTrainGroup`` and ``RolloutManager``.
Tests that need no slime check the project's code against it; the real-slime tier
(``tests/real_slime/test_contract_data.py``) checks it against slime's own code, so a newer slime
fails there until the data and the code follow.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from typing import Any

from tests.helpers import REPO

CONTRACT = REPO / "tests" / "contracts" / "slime.json"


@functools.cache
def contract() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CONTRACT.read_text())
    return data


def slime_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, column)`` of every slime import in a source file."""
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "slime":
            out += [(node.module or "", alias.name, node.col_offset) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [
                (a.name, None, node.col_offset)
                for a in node.names
                if a.name.split(".")[0] == "slime"
            ]
    return out


def project_slime_imports() -> dict[str, set[str]]:
    """Every ``from slime... import name`` in dressage/, by module."""
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / "dressage").rglob("*.py")):
        for module, name, _ in slime_imports(path):
            out.setdefault(module, set())
            if name is not None:
                out[module].add(name)
    return out


def check_slime_imports(path: Path) -> None:
    """Every slime import of ``path`` is lazy (inside a function) and in the contract."""
    imports = slime_imports(path)
    assert imports, f"{path.name} should use slime"
    allowed = contract()["imports"]
    for module, name, col in imports:
        assert col > 0, f"{path.name}: slime must be imported lazily, inside a function"
        assert module in allowed, f"{path.name} imports {module}, which the contract lacks"
        if name is not None:
            assert name in allowed[module], f"{path.name}: {module}.{name} is not in the contract"


def methods(kind: str) -> dict[str, list[str] | None]:
    """``actor``, ``backuper``, ``train_group``, ``rollout_manager`` or ``data_source``:
    method name -> parameter names (``self`` left out)."""
    table: dict[str, list[str] | None] = contract()[f"{kind}_methods"]
    return table
