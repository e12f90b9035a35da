"""``--dressage-continue-from``: a slime run that starts from an earlier run's checkpoint.

What :func:`dressage.slime.continue_from.apply_continue_from` does to slime's parsed arguments,
and what the data source then hands out. tests/real_slime/test_resume_positions.py runs the
same through slime's own parser, ``RolloutManager.load`` and its start-rollout arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dressage.slime.continue_from import ContinueError, apply_continue_from, megatron_checkpoint

pytestmark = pytest.mark.unit


def _earlier(root: Path, iteration: int = 7, *, data: bool = True) -> Path:
    """An earlier run's --save folder: Megatron's tracker, its iteration folder and the data
    source's position saved with it."""
    folder = root / f"iter_{iteration:07d}"
    folder.mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    if data:
        (root / "rollout").mkdir()
        state = {"datasets": {}, "round_robin": {}, "group_index": 9, "sample_index": 18}
        (root / "rollout" / f"dressage_data_source_{iteration}.json").write_text(json.dumps(state))
    return root


def _args(tmp_path: Path, value: str | None) -> SimpleNamespace:
    """slime's arguments after its own check for a run with nothing saved yet: load from
    --ref-load with finetune, rollout ids from 0 (slime_validate_args)."""
    own = tmp_path / "own"
    own.mkdir(exist_ok=True)
    return SimpleNamespace(
        save=str(own), load="/ckpt/student_torch_dist", ref_load="/ckpt/student_torch_dist",
        ckpt_step=None, finetune=True, no_load_optim=True, no_load_rng=True,
        start_rollout_id=0, dressage_continue_from=value,
    )  # fmt: skip


def test_a_run_with_nothing_of_its_own_loads_the_earlier_checkpoint(tmp_path: Path) -> None:
    root = _earlier(tmp_path / "earlier")
    for value in (str(root), str(root / "iter_0000007")):
        args = _args(tmp_path, value)
        apply_continue_from(args)
        assert (args.load, args.ckpt_step) == (str(root), 7)
        assert args.finetune and args.no_load_optim and args.no_load_rng
        assert args.start_rollout_id == 0 and args.ref_load == "/ckpt/student_torch_dist"
        assert args.dressage_continue_state == str(root / "rollout" / "dressage_data_source_7.json")


def test_a_run_with_a_checkpoint_of_its_own_resumes_that_one(tmp_path: Path) -> None:
    root = _earlier(tmp_path / "earlier")
    args = _args(tmp_path, str(root))
    (Path(args.save) / "latest_checkpointed_iteration.txt").write_text("3")
    args.load, args.finetune, args.start_rollout_id = args.save, False, None  # slime's resume
    apply_continue_from(args)
    assert (args.load, args.finetune, args.start_rollout_id) == (args.save, False, None)
    assert args.dressage_continue_state is None


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    args = _args(tmp_path, None)
    before = dict(vars(args))
    apply_continue_from(args)
    assert {k: v for k, v in vars(args).items() if k != "dressage_continue_state"} == before


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "nowhere", "does not exist: name a slime run's checkpoint folder"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "has no latest_checkpointed_iteration"),
        (lambda p: _earlier(p / "e", data=False), "dressage_data_source_7.json does not exist"),
        (lambda p: p / "e2" / "iter_0000002", "does not exist"),
    ],
)
def test_a_checkpoint_that_cannot_be_continued_is_refused_naming_it(
    tmp_path: Path, make: object, needle: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ContinueError) as refused:
        apply_continue_from(_args(tmp_path, str(path)))
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_a_converted_model_is_not_a_run_to_continue(tmp_path: Path) -> None:
    root = tmp_path / "converted"
    (root / "release").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(ContinueError, match="'release', not an iteration"):
        megatron_checkpoint(root)
