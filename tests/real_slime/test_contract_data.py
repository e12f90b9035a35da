"""``tests/contracts/slime.json`` against slime's own code at ``SLIME_ROOT``.

The rest of the suite checks the project against that data; this checks the data against slime:
every module and name the project imports exists (a checkout that lacks one fails here, naming
it), every hook call shape is a call in slime's source at the named site, every flag is one of
slime's parser's, ``Sample`` has exactly the listed fields and statuses, slime's default
converter and DP split use exactly the listed keys, and the actor, ``TensorBackuper``,
``RayTrainGroup``, ``RolloutManager`` and ``DataSource`` methods have the listed parameters.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_contract_data.py
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.real_slime.slime_parts import plain_rollout_manager
from tests.training.slime_contract import contract, methods

pytestmark = pytest.mark.unit


@functools.cache
def _source(root: Path, rel: str) -> ast.Module:
    path = root / rel
    assert path.is_file(), f"{path} is missing"
    return ast.parse(path.read_text())


def _calls(tree: ast.Module) -> set[str]:
    return {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call | ast.Await)}


@pytest.mark.parametrize("module", sorted(contract()["imports"]))
def test_every_imported_slime_name_exists(module: str) -> None:
    loaded = importlib.import_module(module)
    missing = [n for n in contract()["imports"][module] if not hasattr(loaded, n)]
    assert not missing, f"{module} has no {', '.join(missing)} at SLIME_ROOT"


@pytest.mark.parametrize("flag", sorted(contract()["hooks"]))
def test_hook_call_shapes_are_slimes_call_sites(flag: str, slime_checkout: Path) -> None:
    hook = contract()["hooks"][flag]
    calls = _calls(_source(slime_checkout, hook["site"]))
    missing = [c for c in hook["calls"] if c not in calls]
    assert not missing, f"{hook['site']} no longer calls {missing}"


def _parser_flags(root: Path) -> set[str]:
    flags: set[str] = set()
    for path in (root / "slime").rglob("arguments.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("--"):
                    flags.add(node.value)
    return flags


def test_slime_flags_are_slimes_parser_options(slime_checkout: Path) -> None:
    named = set(contract()["flags"]["slime"]) | set(contract()["hooks"])
    assert named - _parser_flags(slime_checkout) == set()


def test_the_hook_loader_splits_on_the_last_dot() -> None:
    from slime.utils.misc import load_function

    assert load_function("os.path.join") is __import__("os").path.join


def test_parse_args_and_create_training_models_take_the_listed_parameters() -> None:
    from slime.ray.placement_group import create_training_models
    from slime.utils.arguments import parse_args

    assert set(contract()["parse_args"]["keywords"]) <= set(
        inspect.signature(parse_args).parameters
    )
    params = list(inspect.signature(create_training_models).parameters)
    assert params == contract()["create_training_models"]["params"]


def _default(field: dataclasses.Field[Any], status: type) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return type(value).__name__ if dataclasses.is_dataclass(value) else value
    value = field.default
    return value.value if isinstance(value, status) else value  # type: ignore[attr-defined]


def test_sample_fields_and_statuses() -> None:
    from slime.utils.types import Sample

    got = [[f.name, _default(f, Sample.Status)] for f in dataclasses.fields(Sample)]
    assert got == contract()["sample_fields"]
    assert {s.name: s.value for s in Sample.Status} == contract()["sample_statuses"]


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_default_converter_keys(slime_checkout: Path) -> None:
    body = _function(
        _source(slime_checkout, "slime/ray/rollout.py"), "_convert_samples_to_train_data"
    )
    keys: list[str] = []
    for node in ast.walk(body):
        found: list[Any] = []
        if isinstance(node, ast.Dict):
            found = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "train_data"
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.slice, ast.Constant)
        ):
            found = [node.slice.value]
        keys += [k for k in found if isinstance(k, str) and k not in keys]
    assert keys == contract()["default_train_data_keys"]


def test_dp_split_keys(slime_checkout: Path) -> None:
    body = _function(_source(slime_checkout, "slime/ray/rollout.py"), "_split_train_data_by_dp")
    lists = [
        [e.value for e in n.elts]
        for n in ast.walk(body)
        if isinstance(n, ast.List) and n.elts and all(isinstance(e, ast.Constant) for e in n.elts)
    ]
    assert lists == [contract()["dp_forwarded_keys"], contract()["dp_whole_keys"]]


def _classes() -> dict[str, Any]:
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor
    from slime.ray.actor_group import RayTrainGroup
    from slime.rollout.data_source import DataSource
    from slime.utils.tensor_backper import TensorBackuper

    return {
        "actor": MegatronTrainRayActor,
        "backuper": TensorBackuper,
        "train_group": RayTrainGroup,
        "rollout_manager": plain_rollout_manager(),
        "data_source": DataSource,
    }


@pytest.mark.parametrize(
    "kind", ["actor", "backuper", "train_group", "rollout_manager", "data_source"]
)
def test_methods_have_the_listed_parameters(kind: str) -> None:
    cls = _classes()[kind]
    for name, params in methods(kind).items():
        assert hasattr(cls, name), f"{cls.__name__} has no {name}"
        if params is None:  # a property
            continue
        got = [p for p in inspect.signature(getattr(cls, name)).parameters]
        got = [p for p in got if p not in {"self", "_ray_trace_ctx"}]
        assert got == params, f"{cls.__name__}.{name}{tuple(got)}"


def test_actor_attributes_are_set_by_slimes_actor(slime_checkout: Path) -> None:
    assigned: set[str] = set()
    for rel in ("slime/backends/megatron_utils/actor.py", "slime/ray/train_actor.py"):
        for node in ast.walk(_source(slime_checkout, rel)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    assigned.add(node.attr)
    assert set(contract()["actor_attributes"]) - assigned == set()


def test_a_checkout_missing_a_name_fails_the_tier_naming_it(
    slime_checkout: Path, tmp_path: Path
) -> None:
    """A slime without ``first_fit_pack`` (the MOPD actor packs teacher micro-batches with it):
    the tier must fail and say so, never skip."""
    import os
    import subprocess
    import sys

    from tests.helpers import REPO

    fake = tmp_path / "slime-checkout"
    for name in ("train.py", "train_async.py"):
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).symlink_to(slime_checkout / name)
    for path in (slime_checkout / "slime").rglob("*.py"):
        if "__pycache__" not in path.parts:
            target = fake / path.relative_to(slime_checkout)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.name == "seqlen_balancing.py":
                text = path.read_text().replace("def first_fit_pack(", "def _renamed_pack(")
                target.write_text(text)
            else:
                target.symlink_to(path)
    env = {**os.environ, "SLIME_ROOT": str(fake)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/real_slime/test_contract_data.py", "-k", "imported_slime_name"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "has no first_fit_pack" in proc.stdout
    assert "skipped" not in proc.stdout.splitlines()[-1]
