"""One layering of settings (issue 30): a flag or slime ``args`` attribute over its variable over
the default is :mod:`dressage.config.layered`'s, nowhere else. The source of ``dressage/`` is
scanned for the other styles: a value ``or`` a variable read, an argparse default read from the
environment, a pydantic ``BaseSettings`` subclass that is not a ``LayeredSettings``, and a
``DRESSAGE_*`` variable read from ``os.environ`` outside ``dressage/config/`` (there, through
``dressage.config.env``'s readers, which refuse undeclared names). Each finding is reported as
file:line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "dressage"
READERS = frozenset({"env_str", "env_int", "env_float", "env_bool"})
"""dressage.config.env's readers of a declared variable."""
ENVIRON_READERS = frozenset({"os.environ.get", "os.getenv"})
ALLOWED = frozenset({"config/env.py", "config/layered.py"})
"""Where variables are read for the layering itself (paths inside the package)."""


def _dotted(node: ast.expr) -> str:
    """``os.environ.get`` for that attribute chain, ``env_str`` for a name, "" otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _reads_a_variable(node: ast.AST) -> bool:
    """``node`` is, or contains, a call that reads an environment variable."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            name = _dotted(inner.func)
            if name in ENVIRON_READERS or name.rsplit(".", 1)[-1] in READERS:
                return True
    return False


def _raw_dressage_read(node: ast.AST) -> bool:
    """``os.environ.get("DRESSAGE_X")``, ``os.getenv("DRESSAGE_X")`` or ``os.environ["DRESSAGE_X"]``
    read (not set)."""
    if isinstance(node, ast.Call) and _dotted(node.func) in ENVIRON_READERS and node.args:
        name = node.args[0]
    elif (
        isinstance(node, ast.Subscript)
        and _dotted(node.value) == "os.environ"
        and isinstance(node.ctx, ast.Load)
    ):
        name = node.slice
    else:
        return False
    return isinstance(name, ast.Constant) and str(name.value).startswith("DRESSAGE_")


def _findings(tree: ast.AST, *, in_config: bool = False) -> list[tuple[int, str]]:
    """(line, what) of each other layering style in one module (``in_config``: a module of
    dressage/config/, where variables may be read raw)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            if any(_dotted(base).rsplit(".", 1)[-1] == "BaseSettings" for base in node.bases):
                found.append((node.lineno, "a BaseSettings that is not a LayeredSettings"))
        if not in_config and _raw_dressage_read(node):
            found.append((node.lineno, "a DRESSAGE_* variable read from os.environ"))
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            if any(_reads_a_variable(value) for value in node.values):
                found.append((node.lineno, "a value `or` a variable read"))
        elif isinstance(node, ast.Call) and _dotted(node.func).endswith("add_argument"):
            for keyword in node.keywords:
                if keyword.arg == "default" and _reads_a_variable(keyword.value):
                    found.append((node.lineno, "an argparse default read from the environment"))
    return found


def scan(root: Path) -> list[str]:
    """``file:line: what`` of every other layering style under ``root``."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in ALLOWED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        in_config = path.relative_to(root).parts[0] == "config"
        for line, what in _findings(tree, in_config=in_config):
            problems.append(f"{path.relative_to(root.parent)}:{line}: {what}")
    return problems


def test_settings_are_layered_one_way_only() -> None:
    problems = scan(PACKAGE)
    assert not problems, (
        "layer a flag over its variable with dressage.config.layered.LayeredSettings, not:\n"
        + "\n".join(problems)
    )


@pytest.mark.parametrize(
    "source",
    [
        "url = view.dressage_proxy_url or env_str('DRESSAGE_PROXY_URL')",
        "config = getattr(args, 'c', None) or os.environ.get('X')",
        "address = ns.address or os.getenv('RAY_ADDRESS') or 'http://127.0.0.1:8265'",
        "p.add_argument('--mopd-config', default=env_str('DRESSAGE_MOPD_CONFIG'))",
        "p.add_argument('--steps', type=int, default=int(os.environ.get('DEMO_STEPS', '100')))",
        "group.add_argument('--n', default=config.env_int('DRESSAGE_FUZZ_SCALE'))",
        "class ProxySettings(ProxyConfig, pydantic_settings.BaseSettings): pass",
        "host = os.environ.get('DRESSAGE_PROXY_HOST')",
        "host = os.getenv('DRESSAGE_PROXY_HOST', '')",
        "host = os.environ['DRESSAGE_PROXY_HOST']",
    ],
)
def test_the_scan_finds_each_other_style(tmp_path: Path, source: str) -> None:
    module = tmp_path / "dressage" / "old.py"
    module.parent.mkdir()
    module.write_text(f"x = 1\n{source}\n")
    assert len(scan(module.parent)) == 1
    assert scan(module.parent)[0].startswith("dressage/old.py:2: ")


def test_the_scan_leaves_a_plain_variable_read_alone(tmp_path: Path) -> None:
    module = tmp_path / "dressage" / "fine.py"
    module.parent.mkdir()
    module.write_text(
        "device = env_str('DRESSAGE_BUILD_DEVICE')\n"
        "key = os.environ.get('OPENAI_API_KEY')\n"
        "p.add_argument('--seed', type=int, default=0)\n"
        "url = given or settings.proxy_url\n"
        "os.environ['DRESSAGE_PROXY_HOST'] = '0.0.0.0'\n"
        "class ProxySettings(ProxyConfig, LayeredSettings): pass\n"
    )
    assert scan(module.parent) == []
