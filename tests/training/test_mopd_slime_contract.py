"""The slime path (hooks, MOPD actor, drivers, command builder) against slime's contract as data.

``tests/contracts/slime.json`` holds the facts (``tests/training/slime_contract.py``); the
real-slime tier checks that data against slime's own code. Here, with no slime at all: every
slime import in dressage/ is lazy and in the contract; each hook the command lines name has the
call shape of its call site in slime; the actor overrides only slime actor methods, with their
parameters, and touches only listed attributes and ``TensorBackuper`` methods; the drivers call
only ``RayTrainGroup``/``RolloutManager`` methods slime has and hand ``actor_cls`` to
``create_training_models``; every flag the MOPD builder emits is a slime or Megatron flag (or
the project's own). The actor's behaviour inside slime is tested in tests/real_slime/.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dressage.config.mopd import MOPD_HOOKS
from dressage.slime.hooks import ROLLOUT_LOG_HOOK
from dressage.training.mopd_train import MOPD_FLAG_DEFAULTS, with_mopd_defaults
from tests.helpers import REPO
from tests.training.slime_contract import (
    check_slime_imports,
    contract,
    methods,
    project_slime_imports,
)

pytestmark = pytest.mark.unit

ACTOR = REPO / "dressage/training/mopd_actor.py"
DRIVER = REPO / "dressage/training/mopd_train.py"

# slime flag -> the dressage hook a slime command line names there (the README's table)
HOOK_PATHS = {"--" + attr.replace("_", "-"): path for attr, path in MOPD_HOOKS.items()} | {
    "--rollout-function-path": "dressage.rollout.partial_async_rollout."
    "generate_rollout_partial_async",
    "--custom-rollout-log-function-path": ROLLOUT_LOG_HOOK,
}


def test_every_slime_import_of_the_package_is_in_the_contract() -> None:
    found = {module: sorted(names) for module, names in project_slime_imports().items()}
    assert found == {m: sorted(n) for m, n in contract()["imports"].items()}


@pytest.mark.parametrize("path", [ACTOR, DRIVER], ids=lambda p: p.name)
def test_slime_is_imported_lazily(path: Path) -> None:
    check_slime_imports(path)


def _load(path: str) -> Any:
    module, _, attr = path.rpartition(".")  # slime's load_function splits on the last dot
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("flag", sorted(HOOK_PATHS))
def test_hooks_take_the_call_shape_of_their_slime_call_site(flag: str) -> None:
    shape = contract()["hooks"][flag]
    hook = _load(HOOK_PATHS[flag])
    target = hook.__init__ if inspect.isclass(hook) else hook
    params = list(inspect.signature(target).parameters.values())[inspect.isclass(hook) :]
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = [p.name for p in positional if p.default is p.empty]
    assert len(required) == len(shape["params"]), (flag, required, shape["params"])
    if flag != "--custom-rm-path":  # slime passes one sample or a list there, by position
        assert required == shape["params"], flag
    names = {p.name for p in params}
    for keyword in shape["keywords"]:
        if keyword == "**kwargs":
            assert any(p.kind is p.VAR_KEYWORD for p in params), f"{flag} needs **kwargs"
        else:
            assert keyword in names, f"{flag}: slime passes {keyword}="
    assert inspect.iscoroutinefunction(hook) == shape["awaited"], flag


def test_data_source_has_slimes_data_source_surface() -> None:
    source = _load(MOPD_HOOKS["data_source_path"])
    for name, params in methods("data_source").items():
        signature = inspect.signature(getattr(source, name))
        assert [p for p in signature.parameters if p != "self"] == params, name


def _actor_class() -> ast.ClassDef:
    tree = ast.parse(ACTOR.read_text())
    return next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "MopdMegatronActor"
    )


def test_actor_overrides_only_slime_actor_methods_with_their_parameters() -> None:
    slime_methods = methods("actor")
    cls = _actor_class()
    assert [b.id for b in cls.bases if isinstance(b, ast.Name)] == ["MegatronTrainRayActor"]
    own = set()
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_mopd"):
            continue
        if fn.name in {"_score_teachers", "_teacher_pass"}:
            continue  # our helpers, not overrides
        own.add(fn.name)
        assert fn.name in slime_methods, f"{fn.name} is not a slime actor method"
        assert [a.arg for a in fn.args.args[1:]] == slime_methods[fn.name], fn.name
    assert own == {
        "init",
        "sleep",
        "load_other_checkpoint",
        "_switch_model",
        "train_actor",
        "compute_log_prob",
    }


def test_actor_uses_only_slime_attributes_and_backuper_methods() -> None:
    cls = _actor_class()
    defined = {n.name for n in ast.walk(cls) if isinstance(n, ast.FunctionDef)}
    own_attrs = {
        t.id for n in cls.body if isinstance(n, ast.AnnAssign | ast.Assign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Name)
    }  # fmt: skip
    allowed = set(contract()["actor_attributes"]) | own_attrs
    backuper = methods("backuper")
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            assert node.attr in allowed | defined | set(methods("actor")), node.attr
        if isinstance(node.value, ast.Attribute) and node.value.attr == "weights_backuper":
            assert node.attr in backuper, f"TensorBackuper.{node.attr}"


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def test_driver_passes_actor_cls_and_calls_only_slime_methods() -> None:
    calls = _calls(DRIVER)
    create = [c for c in calls if getattr(c.func, "id", "") == "create_training_models"]
    assert len(create) == 1 and len(create[0].args) == 3
    assert [k.arg for k in create[0].keywords] == ["actor_cls"]
    assert contract()["create_training_models"]["params"][-1] == "actor_cls"
    parse = [c for c in calls if getattr(c.func, "id", "") == "parse_args"]
    assert [k.arg for k in parse[0].keywords] == contract()["parse_args"]["keywords"]
    on_group, on_manager = set(), set()
    for call in calls:
        func = call.func
        if not isinstance(func, ast.Attribute):
            continue
        if isinstance(func.value, ast.Name) and func.value.id == "actor_model":
            on_group.add(func.attr)
        if func.attr == "remote" and isinstance(func.value, ast.Attribute):
            owner = func.value.value
            if isinstance(owner, ast.Name) and owner.id == "rollout_manager":
                on_manager.add(func.value.attr)
    assert on_group and on_group <= set(methods("train_group")), on_group
    assert on_manager and on_manager <= set(methods("rollout_manager")), on_manager
    assert {"generate", "dispose"} <= on_manager
    assert {"async_train", "update_weights", "save_model"} <= on_group


def test_modules_import_without_slime() -> None:
    code = (
        "import sys, dressage.training.mopd_actor, dressage.training.mopd_train, "
        "dressage.launch.slime_command\n"
        "assert not [m for m in sys.modules if m == 'slime' or m.startswith('slime.')]"
    )
    env_free = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120, env=env_free)


# Flags of the MOPD options the project adds to slime's parser (add_mopd_arguments).
OWN_FLAGS = {
    "--mopd-config",
    "--mopd-advantage-clip",
    "--mopd-objective",
    "--mopd-topk",
    "--mopd-forward-kl-weight",
    "--mopd-metrics-dir",
    "--dressage-proxy-url",
}


@pytest.mark.parametrize(
    "layout",
    [
        {"colocate": False, "rollout_num_gpus": 4, "max_tokens_per_gpu": 8192},
        {"colocate": True, "use_wandb": True, "wandb_project": "p", "wandb_group": "g"},
    ],
    ids=["separate", "colocate-wandb"],
)
@pytest.mark.usefixtures("embedded_checkpoints")  # the command is built from resolved checkpoints
def test_every_built_flag_is_slimes_megatrons_or_ours(
    layout: dict[str, Any], tmp_path: Path
) -> None:
    from dressage.config.run import MopdRunConfig
    from dressage.launch.slime_command import build_mopd_command

    run = MopdRunConfig(
        mopd_config=str(REPO / "configs/mopd/embedded.json"),
        output_dir="/tmp/dressage-contract-run",
        mopd_advantage_clip=3.0,
        mopd_objective="topk",
        mopd_topk=8,
        mopd_forward_kl_weight=0.5,
        check_imports=False,
        **layout,
    )
    argv = build_mopd_command(run, environ={"WANDB_API_KEY": "k"})
    flags = {a.split("=")[0] for a in argv if a.startswith("--")}
    assert {"--mopd-objective", "--mopd-topk", "--mopd-forward-kl-weight"} <= flags
    known = set(contract()["flags"]["slime"]) | set(contract()["flags"]["megatron"]) | OWN_FLAGS
    assert flags - known == set()


def test_driver_adds_missing_mopd_flags_and_keeps_explicit_ones() -> None:
    argv = with_mopd_defaults(["--loss-type=policy_loss", "--num-rollout", "3"])
    assert argv.count("--loss-type=policy_loss") == 1 and "custom_loss" not in argv
    for flag, value in MOPD_FLAG_DEFAULTS[1:]:
        assert flag in argv
        if value is not None:
            assert argv[argv.index(flag) + 1] == value
