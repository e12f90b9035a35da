"""Contract: dressage's slime hooks against shared reference/slime.md (§1.4, §2, §3.2, §3.3).

The expected call shapes and keys are parsed from the reference itself, so a reference updated
for a newer slime fails these tests until the hooks follow.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import pytest

from dressage.rollout.convert_samples import convert_samples_to_train_data
from tests.helpers import SHARED
from tests.rollout.factories import batch, slime_args

pytestmark = pytest.mark.unit

REFERENCE = (SHARED / "reference" / "slime.md").read_text()

# CLI flag -> our dotted path (what a slime command line names)
HOOKS = {
    "--custom-convert-samples-to-train-data-path": (
        "dressage.rollout.convert_samples.convert_samples_to_train_data"
    ),
    "--custom-reward-post-process-path": (
        "dressage.training.reward_post_process.reward_post_process"
    ),
    "--custom-rm-path": "dressage.reward.custom_rm.custom_rm",
    "--data-source-path": "dressage.rollout.data_source.MopdDataSource",
}


def _section(number: str) -> str:
    start = REFERENCE.index(f"### {number} ")
    end = REFERENCE.index("\n### ", start + 1)
    return REFERENCE[start:end]


def _reference_call(flag: str) -> tuple[bool, list[str]]:
    """(awaited, parameters) of the first call shape in the flag's row of the §2 table."""
    row = next(line for line in REFERENCE.splitlines() if line.startswith(f"| `{flag}`"))
    cell = row.split(" | ")[2]
    match = re.search(r"`(await )?\w+\(([^)]*)\)`", cell)
    assert match, f"no call shape in the reference row of {flag}"
    return bool(match.group(1)), [p.strip() for p in match.group(2).split(",")]


def _load(path: str) -> Any:
    module, _, attr = path.rpartition(".")  # slime's load_function splits on the last dot
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("flag", sorted(HOOKS))
def test_hook_signatures_follow_the_reference(flag: str) -> None:
    awaited, expected = _reference_call(flag)
    hook = _load(HOOKS[flag])
    target = hook.__init__ if inspect.isclass(hook) else hook
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(hook):
        params = params[1:]  # self
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = [p for p in positional if p.default is p.empty]
    wanted = [p for p in expected if not p.startswith("**")]
    assert len(required) == len(wanted) == len(positional), (flag, params)
    assert positional[0].name == wanted[0] == "args"
    if flag != "--custom-rm-path":  # slime passes the rm sample positionally; ours names both
        assert [p.name for p in positional] == wanted
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    assert has_kwargs == any(p.startswith("**") for p in expected), flag
    assert inspect.iscoroutinefunction(hook) == awaited, flag


def test_data_source_has_the_abstract_surface() -> None:
    lines = _section("1.4").splitlines()
    line = next(text for text in lines if "abstract base `DataSource`" in text)
    methods = re.findall(r"`(\w+)(?:\(([^)]*)\))?`", line.split("defines", 1)[1])
    assert {name for name, _ in methods} == {
        "get_samples",
        "add_samples",
        "save",
        "load",
        "__len__",
    }
    source = _load(HOOKS["--data-source-path"])
    for name, params in methods:
        method = getattr(source, name)
        assert callable(method), name
        signature = inspect.signature(method)
        for param in filter(None, (p.strip() for p in params.split(","))):
            pname, _, default = param.partition("=")
            assert pname in signature.parameters, (name, pname)
            if default:
                assert repr(signature.parameters[pname].default) == default, (name, pname)
    assert "num_samples" in inspect.signature(source.get_samples).parameters


def _reference_keys() -> list[str]:
    """Every train_data key §3.2 lists, in order of first mention."""
    keys: list[str] = []
    for line in _section("3.2").splitlines():
        match = re.match(r"\s*(?:\d+\.|-)\s+((?:`\w+`(?:\s*/\s*)?)+)", line)
        for key in re.findall(r"`(\w+)`", match.group(1)) if match else []:
            if key not in keys:
                keys.append(key)
    return keys


def _full_batch(args: Any) -> list:
    samples = batch(args, [[[1, 2], [3]]], teacher_id="t")
    for s in samples:
        n = s.response_length
        s.metadata["round_number"] = 1
        s.train_metadata = {"k": 1}
        s.rollout_routed_experts = [[0]]
        s.teacher_log_probs = [-0.1] * n
        s.rollout_top_p_token_ids = [1] * n
        s.rollout_top_p_token_offsets = list(range(n + 1))
        s.multimodal_train_inputs = {"pixel_values": [0]}
    return samples


def test_converter_emits_every_key_of_slimes_default() -> None:
    expected = _reference_keys()
    assert expected[:1] == ["rollout_ids"] and "source_names" in expected  # parsed sanely
    args = slime_args(rollout_top_p=0.9)
    data = convert_samples_to_train_data(args, _full_batch(args))
    assert set(data) == set(expected) | {"prompt"}
    base = ["tokens", "response_lengths", "rewards", "raw_reward", "truncated", "sample_indices"]
    assert list(data)[: len(base) + 3] == [*base, "rollout_ids", "loss_masks", "rollout_mask_sums"]
    assert all(len(v) == 3 for v in data.values())


def test_everything_the_trainer_needs_is_forwarded_per_dp_rank() -> None:
    section = _section("3.3")
    listed = section.split("only these keys are partitioned and forwarded:", 1)[1]
    forwarded = set(re.findall(r"\w+", listed.split("`", 2)[1]))
    assert "prompt" in forwarded and "rollout_ids" in forwarded
    args = slime_args(rollout_top_p=0.9)
    data = convert_samples_to_train_data(args, _full_batch(args))
    # raw_reward is shipped whole; metadata is dropped by slime (reference §3.3 gotcha)
    assert set(data) - forwarded == {"raw_reward", "metadata"}
