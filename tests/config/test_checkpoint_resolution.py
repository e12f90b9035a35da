"""Checkpoint resolution never trains: a tiny teacher that is not built is reported as not
built, naming the command that builds it; building is its own step (``dressage assets``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dressage.config.mopd import load_mopd_config
from dressage.launch.preflight import checkpoint_problems
from dressage.tiny.checkpoints import CheckpointNotBuiltError, find_checkpoint, resolve_checkpoint
from dressage.tiny.teachers import cached_teacher_dir, parse_teacher_spec
from tests.helpers import REPO

pytestmark = pytest.mark.unit

EMBEDDED = REPO / "configs/mopd/embedded.json"
# a recipe nobody builds: resolving it used to fine-tune it (minutes), now it is only looked up
UNBUILT = "tiny-sft:task=lookup,steps=3,examples=5,data_seed=91817"


def test_an_unbuilt_teacher_is_not_trained_by_resolution() -> None:
    assert cached_teacher_dir(parse_teacher_spec(UNBUILT)) is None
    with pytest.raises(CheckpointNotBuiltError, match="dressage assets") as info:
        resolve_checkpoint(UNBUILT)
    assert info.value.spec == UNBUILT and UNBUILT in str(info.value)
    assert find_checkpoint(UNBUILT) is None
    assert cached_teacher_dir(parse_teacher_spec(UNBUILT)) is None  # still not built


def test_materialize_names_the_unbuilt_teacher(tmp_path: Path) -> None:
    data = json.loads(EMBEDDED.read_text())
    data["teachers"]["lookup"]["load"] = UNBUILT
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointNotBuiltError, match="task=lookup,steps=3"):
        load_mopd_config(path).materialize(resolve_checkpoint)


@pytest.mark.usefixtures("embedded_checkpoints")
def test_validation_reports_the_unbuilt_teacher_under_its_name(tmp_path: Path) -> None:
    data = json.loads(EMBEDDED.read_text())
    data["teachers"]["lookup"]["load"] = UNBUILT
    for ds in data["datasets"]:
        ds["path"] = str(EMBEDDED.parent / ds["path"])
        ds["eval_path"] = str(EMBEDDED.parent / ds["eval_path"])
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(data))
    config = load_mopd_config(path)
    assert config.built_specs()[-1] == UNBUILT
    problems, vocab = checkpoint_problems(config, student=None, objective="mopd")
    ((subject, message),) = [(p.subject, p.message) for p in problems]
    assert subject == "teacher 'lookup'"
    assert "is not built yet" in message and "dressage assets" in message
    assert vocab and vocab > 100  # the student (built) was still inspected
    assert cached_teacher_dir(parse_teacher_spec(UNBUILT)) is None


@pytest.mark.integration
def test_build_checkpoints_builds_in_parallel_and_returns_bad_specs_as_errors() -> None:
    """Two specs in two processes: each comes back as its folder, in order; a malformed spec
    comes back as its ValueError (naming the key) instead of stopping the others."""
    from dressage.tiny.checkpoints import build_checkpoints
    from dressage.tiny.model import TinyModelSpec, tiny_model_dir

    specs = ["tiny:seed=41,hidden_size=16,head_dim=4", "tiny:seed=42,colour=red"]
    first, second = build_checkpoints(specs, workers=2)
    assert first == tiny_model_dir(TinyModelSpec(seed=41, hidden_size=16, head_dim=4))
    assert isinstance(second, ValueError) and "colour=red" in str(second)
    assert build_checkpoints([]) == []


@pytest.mark.integration
def test_build_checkpoints_under_a_main_script_that_cannot_be_run_again(tmp_path: Path) -> None:
    """Inside an Airflow task the main script is ``airflow``, whose import fails in the task's
    sandbox: a multiprocessing child that re-runs the parent's main script died there (the
    ``prepare`` task of a fresh machine). Each build runs in a fresh interpreter instead."""
    import subprocess
    import sys

    script = tmp_path / "main_script.py"
    script.write_text(
        "if __name__ != '__main__':\n"
        "    raise SystemExit('the main script ran again as ' + __name__)\n"
        "from dressage.tiny.checkpoints import build_checkpoints\n"
        "specs = [f'tiny:seed={s},hidden_size=16,head_dim=4' for s in (43, 44)]\n"
        "print(all(hasattr(o, 'is_dir') for o in build_checkpoints(specs, workers=2)))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.usefixtures("embedded_checkpoints")
def test_a_config_that_does_not_load_still_has_its_checkpoints_checked(tmp_path: Path) -> None:
    """`dressage mopd check` lists every problem: a misspelled dataset key does not hide an
    unbuilt teacher, which is said once, as the command that builds it."""
    from dressage.launch.preflight import preflight

    data = json.loads(EMBEDDED.read_text())
    data["teachers"]["lookup"]["load"] = UNBUILT
    data["datasets"][0]["wieght"] = data["datasets"][0].pop("weight")
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(data))
    said = [str(p) for p in preflight(str(path)).problems]
    assert any("wieght: is not a known key (did you mean 'weight'?)" in p for p in said), said
    assert any(f"run `dressage assets --config {path}` first" in p for p in said), said
    assert sum("not built yet" in p for p in said) == 1
