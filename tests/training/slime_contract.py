"""Reading shared reference/slime.md for the contract tests of dressage's slime-facing modules.

slime cannot be installed here, so the modules that import it are checked against the reference
as text: which modules and names it documents, which §10 says moved or were removed, and which
methods (with which parameters) the actor group and the rollout manager have.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.helpers import SHARED


@functools.cache
def reference() -> str:
    path = SHARED / "reference" / "slime.md"
    assert path.is_file(), f"the contract needs {path}"
    return path.read_text()


def section(start: str, end: str) -> str:
    text = reference()
    begin = text.index(start)
    return text[begin : text.index(end, begin + len(start))]


def documented_methods(text: str) -> dict[str, list[str]]:
    """``name(params)`` spans of a reference section -> parameter names."""
    out: dict[str, list[str]] = {}
    for name, params in re.findall(r"`(\w+)\(([^`)]*)\)", text):
        names = [p.split("=")[0].strip().lstrip("*") for p in params.split(",") if p.strip()]
        out.setdefault(name, [n for n in names if n])
    return out


def moved_and_removed() -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """§10: modules now under slime.observability, dead module paths, dead (module, name)."""
    drift = section("## 10.", "\n---")
    moved = set(re.findall(r"`(\w+)`", re.search(r"moved: (.*)", drift).group(1)))  # type: ignore[union-attr]
    dead = {f"slime.utils.{m}" for m in moved}
    removed = re.search(r"removed: (.*)", drift).group(1)  # type: ignore[union-attr]
    dead |= {p[:-3].replace("/", ".") for p in re.findall(r"`(slime/[\w/]+\.py)`", removed)}
    dead_names = set()
    for names, module in re.findall(r"((?:`\w+`[, and]*)+) moved from `([\w.]+)`", drift):
        dead_names |= {(module, n) for n in re.findall(r"`(\w+)`", names)}
    return {f"slime.observability.{m}" for m in moved}, dead, dead_names


def slime_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, column)`` of every slime import in a source file."""
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slime"):
            out += [(node.module or "", alias.name, node.col_offset) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [
                (a.name, None, node.col_offset) for a in node.names if a.name.startswith("slime")
            ]
    return out


def check_slime_imports(path: Path) -> None:
    """Every slime import is lazy, exists at the reference commit and did not move (§10)."""
    text = reference()
    moved_to, dead, dead_names = moved_and_removed()
    imports = slime_imports(path)
    assert imports, f"{path.name} should use slime"
    for module, name, col in imports:
        assert col > 0, f"{path.name}: slime must be imported lazily, inside a function"
        assert module not in dead, f"{module} was moved or removed (reference §10)"
        as_path = "slime/" + module.removeprefix("slime.").replace(".", "/") + ".py"
        assert module in text or as_path in text or module in moved_to, f"{module} undocumented"
        if name is not None:
            assert (module, name) not in dead_names, f"{module}.{name} moved away (§10)"
            assert re.search(rf"\b{name}\b", text), f"{name} is not in the reference"
