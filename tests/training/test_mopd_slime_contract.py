"""The slime path (mopd_actor, mopd_train, the command builder) against reference/slime.md.

slime cannot be installed here, so this checks every slime name those modules use against the
reference, read as text: imported modules and names exist at the reference commit and are not
among those §10 lists as moved or removed; overridden actor methods are §6.3's, with §6.3's
parameters; driver calls on the actor group and the rollout manager are §6.3's and §6.4's;
``create_training_models`` gets ``actor_cls``; every flag of the built command is documented or
listed below. The actor's behaviour runs against a small fake of the §6.3/§7.1 semantics.
"""

from __future__ import annotations

import ast
import inspect
import json
import pickle
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dressage.config.mopd import MOPD_HOOKS
from dressage.training import mopd_actor
from dressage.training.mopd_train import MOPD_FLAG_DEFAULTS, ROLLOUT_LOG_HOOK, with_mopd_defaults
from tests.helpers import REPO
from tests.training.slime_contract import (
    check_slime_imports,
    documented_methods,
    reference,
    section,
)

pytestmark = pytest.mark.unit

ACTOR = REPO / "dressage/training/mopd_actor.py"
DRIVER = REPO / "dressage/training/mopd_train.py"

# Flags the builder emits that reference/slime.md does not mention (it documents the plug-in
# surface, not every option). Each is a standard option; adding one here is a conscious choice.
UNDOCUMENTED_FLAGS = {
    "--hf-checkpoint": "slime: HF folder for tokenizer, config and the rollout engines",
    "--ref-load": "Megatron-LM: torch_dist folder of the reference/initial weights",
    "--save-interval": "Megatron-LM",
    "--tensor-model-parallel-size": "Megatron-LM",
    "--context-parallel-size": "Megatron-LM",
    "--pipeline-model-parallel-size": "Megatron-LM",
    "--seed": "Megatron-LM",
    "--actor-num-nodes": "slime placement",
    "--actor-num-gpus-per-node": "slime placement",
    "--rollout-num-gpus": "slime placement",
    "--rollout-num-gpus-per-engine": "slime placement",
    "--use-dynamic-batch-size": "slime (with --max-tokens-per-gpu, §5)",
    "--rollout-seed": "slime",
    "--use-wandb": "slime tracking",
    "--wandb-project": "slime tracking",
    "--wandb-group": "slime tracking",
}


@pytest.mark.parametrize("path", [ACTOR, DRIVER], ids=lambda p: p.name)
def test_slime_modules_and_names_exist_at_the_reference_commit(path: Path) -> None:
    check_slime_imports(path)


def _actor_class() -> ast.ClassDef:
    tree = ast.parse(ACTOR.read_text())
    return next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "MopdMegatronActor"
    )


def test_actor_overrides_only_documented_methods_with_their_parameters() -> None:
    documented = documented_methods(section("### 6.3", "### 6.4"))
    cls = _actor_class()
    bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
    assert bases == ["MegatronTrainRayActor"]
    own = set()
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        own.add(fn.name)
        if fn.name.startswith("_score"):
            continue  # our helper, not an override
        assert fn.name in documented, f"{fn.name} is not a documented actor method (§6.3)"
        params = [a.arg for a in fn.args.args[1:]]
        assert params == documented[fn.name], f"{fn.name}{params} vs reference"
    assert {"init", "train_actor", "compute_log_prob", "_switch_model"} <= own


def test_actor_calls_only_documented_slime_surface() -> None:
    documented = documented_methods(section("### 6.3", "### 6.4"))
    backuper = documented_methods(section("### 7.1", "### 7.2"))
    tree = ast.parse(ACTOR.read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    used = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target, attr = node.func.value, node.func.attr
        if isinstance(target, ast.Call) and getattr(target.func, "id", "") == "super":
            used.add(attr)
        elif isinstance(target, ast.Name) and target.id in {"self", "actor"}:
            if attr not in defined:
                used.add(attr)
        elif isinstance(target, ast.Attribute) and target.attr == "weights_backuper":
            assert attr in backuper, f"TensorBackuper.{attr} is not in §7.1"
    assert used == {
        "init",
        "train_actor",
        "compute_log_prob",
        "_switch_model",
        "load_other_checkpoint",
    }
    assert used <= set(documented)
    assert "self.weights_backuper" in reference()
    assert "`teacher_log_probs`" in reference() and 'store_prefix="teacher_"' in reference()


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def test_driver_passes_actor_cls_and_callsdocumented_methods() -> None:
    assert "create_training_models(args, pgs, rollout_manager, actor_cls=None)" in reference()
    calls = _calls(DRIVER)
    create = [c for c in calls if getattr(c.func, "id", "") == "create_training_models"]
    assert len(create) == 1 and len(create[0].args) == 3
    assert [k.arg for k in create[0].keywords] == ["actor_cls"]
    parse = [c for c in calls if getattr(c.func, "id", "") == "parse_args"]
    assert [k.arg for k in parse[0].keywords] == ["add_custom_arguments"]
    assert "parse_args(add_custom_arguments=fn)" in reference()

    group_line = next(
        line for line in reference().splitlines() if "`RayTrainGroup` methods" in line
    )
    group_methods = set(re.findall(r"`(\w+)\(", group_line))
    manager_methods = set(documented_methods(section("### 6.4", "\n---")))
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
    assert on_group and on_group <= group_methods, on_group - group_methods
    assert on_manager and on_manager <= manager_methods, on_manager - manager_methods
    assert {"generate", "dispose", "save"} <= on_manager
    assert {"async_train", "update_weights", "save_model"} <= on_group


def test_modules_import_without_slime() -> None:
    code = (
        "import sys, dressage.training.mopd_actor, dressage.training.mopd_train, "
        "dressage.launch.slime_command\n"
        "assert not [m for m in sys.modules if m == 'slime' or m.startswith('slime.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


# -- flags and hook call shapes ---------------------------------------------------------------


def test_every_built_flag_is_documented_or_listed() -> None:
    from dressage.launch.mopd_run import MopdRunConfig
    from dressage.launch.slime_command import build_mopd_command

    run = MopdRunConfig(
        mopd_config=str(REPO / "configs/mopd/embedded.json"),
        output_dir="/tmp/dressage-contract-run",
        ref_load=None,
        colocate=False,
        rollout_num_gpus=4,
        max_tokens_per_gpu=8192,
        mopd_advantage_clip=3.0,
        check_imports=False,
    )
    argv = build_mopd_command(run)
    text = reference()
    for flag in {a for a in argv if a.startswith("--") and not a.startswith("--mopd-")}:
        attr = flag[2:].replace("-", "_")
        documented = re.search(re.escape(flag) + r"(?![\w-])", text) or re.search(
            rf"(?<!\w){attr}(?!\w)", text
        )
        assert documented or flag in UNDOCUMENTED_FLAGS, f"{flag} is neither documented nor listed"
    for attr in MOPD_HOOKS:
        assert "--" + attr.replace("_", "-") in text  # every hook flag is a §2 hook


SHAPES = {  # reference §2: how slime calls each hook
    "custom_advantage_function_path": (["args", "rollout_data"], False),
    "custom_loss_function_path": (["args", "batch", "logits", "sum_of_sample_mean"], False),
    "custom_convert_samples_to_train_data_path": (["args", "samples"], False),
    "custom_reward_post_process_path": (["args", "samples"], False),
    "custom_rm_path": (["args", "sample"], True),
    "custom_generate_function_path": (["args", "sample", "sampling_params"], True),
    "data_source_path": (["args"], False),
}


@pytest.mark.parametrize("attr", sorted(SHAPES))
def test_hook_paths_resolve_with_slimes_call_shape(attr: str) -> None:
    import importlib

    module_name, _, name = MOPD_HOOKS[attr].rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            pytest.skip(f"{module_name} is not written yet (another issue)")
        raise
    target = getattr(module, name)
    params, is_async = SHAPES[attr]
    if inspect.isclass(target):
        target = target.__init__
        params = ["self", *params]
    signature = inspect.signature(target)
    positional = [
        p.name for p in signature.parameters.values() if p.kind <= p.POSITIONAL_OR_KEYWORD
    ]
    assert len(positional) >= len(params), (attr, positional)
    assert inspect.iscoroutinefunction(target) == is_async, attr


def test_rollout_log_hook_has_slimes_call_shape() -> None:
    from dressage.training.metrics import log_rollout_metrics

    assert ROLLOUT_LOG_HOOK == "dressage.training.metrics.log_rollout_metrics"
    shape = "fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time)"
    assert shape in reference()
    assert list(inspect.signature(log_rollout_metrics).parameters) == [
        "rollout_id",
        "args",
        "samples",
        "rollout_extra_metrics",
        "rollout_time",
    ]


def test_driver_adds_missing_mopd_flags_and_keeps_explicit_ones() -> None:
    argv = with_mopd_defaults(["--loss-type=policy_loss", "--num-rollout", "3"])
    assert argv.count("--loss-type=policy_loss") == 1 and "custom_loss" not in argv
    for flag, value in MOPD_FLAG_DEFAULTS[1:]:
        assert flag in argv
        if value is not None:
            assert argv[argv.index(flag) + 1] == value


# -- the actor against a fake of slime's documented semantics ---------------------------------


class _FakeBackuper:
    """§7.1: tags hold copies of the live weights; restore of an unknown tag is an error."""

    def __init__(self, actor: Any) -> None:
        self.actor, self.store = actor, {}

    @property
    def backup_tags(self) -> list[str]:
        return list(self.store)

    def backup(self, tag: str) -> None:
        self.store[tag] = self.actor.live

    def restore(self, tag: str) -> None:
        if tag not in self.store:
            raise ValueError(tag)
        self.actor.live = self.store[tag]


class _FakeMegatronActor:
    """§6.3/§7.1/§7.2: what the MOPD actor relies on; log-probs say which weights made them."""

    def init(self, args: Any, role: str, with_ref: bool = False, with_opd_teacher: bool = False):  # type: ignore[no-untyped-def]
        self.args, self.live, self.switches = args, "actor-weights", []
        self.weights_backuper = _FakeBackuper(self)
        self.weights_backuper.backup("actor")
        return 0

    def load_other_checkpoint(self, tag: str, path: str) -> None:
        step = {"ref": "ref_ckpt_step", "teacher": "opd_teacher_ckpt_step"}.get(tag)
        self.live = f"{path}@{getattr(self.args, step, None) if step else None}"
        self.weights_backuper.backup(tag)

    def _switch_model(self, tag: str) -> None:
        self.switches.append(tag)
        self.weights_backuper.restore(tag)

    def compute_log_prob(self, data_iterator: Any, num_microbatches: Any, store_prefix: str = ""):  # type: ignore[no-untyped-def]
        return {f"{store_prefix}log_probs": [f"{self.live}|{token}" for token in data_iterator]}

    def train_actor(self, rollout_id: int, rollout_data: dict, external_data: Any = None):  # type: ignore[no-untyped-def,type-arg]
        iterator = rollout_data["tokens"]
        if "teacher" in self.weights_backuper.backup_tags:  # §7.2 megatron OPD, if tag-driven
            self._switch_model("teacher")
            rollout_data.update(self.compute_log_prob(iterator, 1, store_prefix="teacher_"))
        self._switch_model("actor")
        rollout_data.update(self.compute_log_prob(iterator, 1, store_prefix=""))
        rollout_data["advantages"] = list(
            zip(rollout_data["teacher_log_probs"], rollout_data["log_probs"], strict=True)
        )
        self.weights_backuper.backup("actor")


@pytest.fixture
def actor_cls(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = types.ModuleType("slime.backends.megatron_utils.actor")
    fake.MegatronTrainRayActor = _FakeMegatronActor  # type: ignore[attr-defined]
    for name in ("slime", "slime.backends", "slime.backends.megatron_utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    mopd_actor.make_mopd_actor_cls.cache_clear()
    yield mopd_actor.make_mopd_actor_cls()
    mopd_actor.make_mopd_actor_cls.cache_clear()


@pytest.fixture
def actor(actor_cls: Any, tmp_path: Path) -> Any:
    config = {
        "teachers": {
            "calc": {"load": "/ckpt/calc"},
            "look": {"load": "/ckpt/look", "ckpt_step": 7},
        },
        "datasets": [
            {"name": n, "path": "x.jsonl", "teacher_id": n, "weight": 1, "agent_mode": "blackbox"}
            for n in ("calc", "look")
        ],
    }
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    args = types.SimpleNamespace(
        mopd_config=str(tmp_path / "mopd.json"), opd_teacher_ckpt_step=None
    )
    instance = actor_cls()
    assert instance.init(args, "actor") == 0
    return instance


def test_actor_class_is_picklable_by_reference(actor_cls: Any) -> None:
    assert actor_cls.__module__ == "dressage.training.mopd_actor"
    assert mopd_actor.MopdMegatronActor is actor_cls
    assert pickle.loads(pickle.dumps(actor_cls)) is actor_cls
    assert b"MopdMegatronActor" in pickle.dumps(actor_cls)


def test_teachers_are_backed_up_under_their_tags(actor: Any) -> None:
    store = actor.weights_backuper.store
    assert store["teacher:calc"] == "/ckpt/calc@None"
    assert store["teacher:look"] == "/ckpt/look@7"  # ckpt_step honoured via slime's literal tag
    assert actor.args.opd_teacher_ckpt_step is None  # restored
    assert actor.live == "actor-weights"


def test_each_sample_is_scored_by_its_own_teacher(actor: Any) -> None:
    data = {
        "tokens": ["t0", "t1", "t2", "t3"],
        "prompt": ["look", "calc", "look", "calc"],
        "rollout_ids": [0, 1, 0, 2],
        "sample_indices": [10, 11, 12, 13],
    }
    actor.train_actor(5, data)
    assert data["teacher_log_probs"] == [
        "/ckpt/look@7|t0",
        "/ckpt/calc@None|t1",
        "/ckpt/look@7|t2",
        "/ckpt/calc@None|t3",
    ]
    assert data["log_probs"] == [f"actor-weights|t{i}" for i in range(4)]
    assert actor.live == "actor-weights"
    # slime's own OPD pass (the "teacher" tag exists) yields nothing; the active tag comes back.
    assert actor.switches[-5:] == ["teacher", "teacher:calc", "teacher:look", "teacher", "actor"]


@pytest.mark.parametrize(
    ("prompt", "rollout_ids", "message"),
    [
        (["calc", "physics"], [0, 1], r"sample index 21 .*'physics' is not a loaded teacher"),
        (["calc", ""], [0, 1], r"sample index 21 .*no teacher_id"),
        (["calc", "look"], [4, 4], r"rollout_id 4: siblings disagree"),
        (None, [0, 1], r"no 'prompt' teacher ids"),
    ],
)
def test_bad_teacher_ids_fail_before_the_step(
    actor: Any, prompt: Any, rollout_ids: list[int], message: str
) -> None:
    data = {
        "tokens": ["a", "b"],
        "prompt": prompt,
        "rollout_ids": rollout_ids,
        "sample_indices": [20, 21],
    }
    before = len(actor.switches)
    with pytest.raises(ValueError, match=message):
        actor.train_actor(0, data)
    assert "advantages" not in data and "teacher_log_probs" not in data
    assert not [t for t in actor.switches[before:] if t.startswith("teacher:")]


def test_a_step_without_log_prob_pass_fails_closed(
    actor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_FakeMegatronActor, "train_actor", lambda self, *a, **k: None)
    with pytest.raises(RuntimeError, match="no teacher scored"):
        actor.train_actor(3, {"tokens": ["a"], "prompt": ["calc"]})
