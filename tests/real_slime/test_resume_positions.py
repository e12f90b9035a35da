"""A resubmitted cluster job continues where the last one saved, by slime's own rules.

The cluster commands (:mod:`dressage.jobs.cluster`) pass ``--save`` and ``--load`` at one folder.
What a resubmission then does is slime's: its arguments' check takes ``--load`` as a Megatron
checkpoint when ``latest_checkpointed_iteration.txt`` is there (``_is_megatron_checkpoint``, run
here), its actor starts at the loaded iteration plus one, and ``create_training_models`` has the
rollout manager load the data source at ``start_rollout_id - 1`` (``RolloutManager.load``, slime's
own method, run here over the project's ``MopdDataSource``). The first job's saves follow
slime's loop: ``should_run_periodic_action`` (slime's) picks the rollouts, ``RolloutManager.save``
(slime's) writes the data source's position. Megatron's checkpoint writer does not run on CPU: a
stand-in writes the tracker as Megatron does (the iteration as text), and the embedded trainer's
own checkpoints are checked against the same rules.

Checked: the resumed job hands out exactly the prompts the uninterrupted job would have handed
out next; a folder with no checkpoint is not taken for one (a fresh start); and the embedded
trainer's folder is what slime's rules read as a checkpoint of the same rollout.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dressage.rollout.data_source import MopdDataSource

pytestmark = pytest.mark.unit

TRACKER = "latest_checkpointed_iteration.txt"
BATCH = 3
NUM_ROLLOUT = 9
SAVE_INTERVAL = 4


def _datasets(root: Path) -> list[dict[str, Any]]:
    out = []
    for name, n in (("calc", 7), ("facts", 4)):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"input": f"{name} {i}", "label": i}) + "\n"
                                for i in range(n)))  # fmt: skip
        out.append({"name": name, "path": str(path), "teacher_id": name, "weight": 1.0})
    return out


def _args(datasets: list[dict[str, Any]], folder: Path) -> SimpleNamespace:
    return SimpleNamespace(
        dressage_datasets=datasets,
        n_samples_per_prompt=2,
        rollout_shuffle=True,
        rollout_seed=5,
        save=str(folder),
        load=str(folder),
    )


def _manager(source: MopdDataSource) -> Any:
    """slime's RolloutManager with only what ``save`` and ``load`` touch (the class's own
    methods, called on an instance made without its GPU-bound ``__init__``)."""
    from slime.ray.rollout import RolloutManager

    cls = RolloutManager.__ray_metadata__.modified_class
    manager = cls.__new__(cls)
    manager.data_source = source
    return manager


def _prompts(source: MopdDataSource) -> list[str]:
    return [group[0].prompt for group in source.get_samples(BATCH)]  # type: ignore[misc]


def _megatron_tracker(folder: Path, iteration: int) -> None:
    """Stand-in for Megatron's checkpoint writer (no GPU here): the tracker it writes last."""
    (folder / f"iter_{iteration:07d}").mkdir(parents=True, exist_ok=True)
    (folder / TRACKER).write_text(str(iteration))


def _slime_start_rollout_id(load: Path) -> int:
    """slime's rules: a Megatron checkpoint at --load is loaded and its actor starts one past
    the tracker's iteration; otherwise it starts at 0 (slime_validate_args)."""
    from slime.backends.megatron_utils.checkpoint import _is_megatron_checkpoint

    if not _is_megatron_checkpoint(load):
        return 0
    return int((load / TRACKER).read_text().strip()) + 1


def test_a_resubmitted_job_hands_out_the_prompts_the_first_would_have(tmp_path: Path) -> None:
    from slime.utils.misc import should_run_periodic_action

    datasets = _datasets(tmp_path)
    straight = MopdDataSource(_args(datasets, tmp_path / "unused"))
    expected = [_prompts(straight) for _ in range(NUM_ROLLOUT)]

    folder = tmp_path / "checkpoints"
    first = _manager(MopdDataSource(_args(datasets, folder)))
    crashed_after = 6  # rollouts 0..6 ran, then the node died before saving again
    for rollout_id in range(crashed_after + 1):
        assert _prompts(first.data_source) == expected[rollout_id]
        if should_run_periodic_action(rollout_id, SAVE_INTERVAL, None, NUM_ROLLOUT):
            _megatron_tracker(folder, rollout_id)
            first.save(rollout_id)

    start = _slime_start_rollout_id(folder)
    assert start == SAVE_INTERVAL  # saved after rollout 3: rollouts 4 to 6 run again
    second = _manager(MopdDataSource(_args(datasets, folder)))
    second.load(start - 1)  # create_training_models, with rollout_global_dataset
    resumed = [_prompts(second.data_source) for _ in range(start, NUM_ROLLOUT)]
    assert resumed == expected[start:]


def test_a_folder_with_no_checkpoint_starts_fresh(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert _slime_start_rollout_id(folder) == 0
    datasets = _datasets(tmp_path)
    fresh = _manager(MopdDataSource(_args(datasets, folder)))
    fresh.load(-1)  # nothing saved: the source stays at its start
    assert _prompts(fresh.data_source) == _prompts(MopdDataSource(_args(datasets, tmp_path / "x")))


def test_the_embedded_trainers_checkpoint_is_read_by_slimes_rules(tmp_path: Path) -> None:
    """The embedded default writes Megatron's layout: slime takes its folder for a checkpoint and
    starts where the embedded trainer's own load does."""
    import torch

    from dressage.training.embedded.checkpoint import latest_checkpoint, save_checkpoint

    class Trainer:
        """What save_checkpoint reads of an EmbeddedTrainer (the layout is under test, not the
        model: tests/training/test_embedded_checkpoint.py saves and loads a real one)."""

        model_path = tmp_path / "student"
        teachers: dict[str, Path] = {}
        num_steps = 8

        def __init__(self) -> None:
            self.model = torch.nn.Linear(2, 2)
            self.optimizer = torch.optim.AdamW(self.model.parameters())

        def save_weights(self, folder: Path) -> None:
            folder.mkdir()
            torch.save(self.model.state_dict(), folder / "model.pt")

    folder = tmp_path / "checkpoints"
    save_checkpoint(folder, 7, Trainer(), {"data_source": {}})
    from slime.backends.megatron_utils.checkpoint import _is_megatron_checkpoint

    latest = latest_checkpoint(folder)
    assert latest is not None and latest.name == "iter_0000007"
    assert _is_megatron_checkpoint(folder) and _is_megatron_checkpoint(latest)
    assert _slime_start_rollout_id(folder) == 8


def test_a_new_run_continues_an_earlier_runs_prompts(tmp_path: Path) -> None:
    """``--dressage-continue-from`` (dressage.slime.continue_from): a new run in a folder of
    its own starts at rollout 0 (slime's rule for a run with nothing saved) and its data source,
    loaded by slime's ``RolloutManager.load(start_rollout_id - 1)``, hands out the prompts the
    earlier run would have handed out after its last checkpoint."""
    from slime.utils.misc import should_run_periodic_action

    from dressage.slime.continue_from import apply_continue_from

    datasets = _datasets(tmp_path)
    straight = MopdDataSource(_args(datasets, tmp_path / "unused"))
    expected = [_prompts(straight) for _ in range(2 * NUM_ROLLOUT)]
    earlier = tmp_path / "earlier" / "checkpoints"
    first = _manager(MopdDataSource(_args(datasets, earlier)))
    for rollout_id in range(NUM_ROLLOUT):
        assert _prompts(first.data_source) == expected[rollout_id]
        if should_run_periodic_action(rollout_id, SAVE_INTERVAL, None, NUM_ROLLOUT):
            _megatron_tracker(earlier, rollout_id)
            first.save(rollout_id)
    last = int((earlier / TRACKER).read_text())
    assert last == NUM_ROLLOUT - 1  # slime saves after the last rollout too

    own = tmp_path / "later" / "checkpoints"
    args = _args(datasets, own)
    assert _slime_start_rollout_id(own) == 0
    args.dressage_continue_from = str(earlier)
    apply_continue_from(args)
    assert (args.load, args.ckpt_step, args.start_rollout_id) == (str(earlier), last, 0)
    second = _manager(MopdDataSource(args))
    second.load(args.start_rollout_id - 1)
    continued = [_prompts(second.data_source) for _ in range(NUM_ROLLOUT)]
    assert continued == expected[last + 1 : last + 1 + NUM_ROLLOUT]


def test_slimes_parser_with_the_continue_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through slime's own parser and argument checks (MOPD's driver): a run whose --save
    folder is empty loads the earlier run's checkpoint with Megatron's --finetune from rollout
    0; once it has saved a checkpoint of its own, a resubmission resumes that one."""
    from tests.helpers import megatron_lm_root

    if megatron_lm_root() is None:
        pytest.skip("MEGATRON_LM_ROOT is not set: slime's parser needs Megatron-LM's training")
    import sys

    from dressage.training.mopd_train import parse_mopd_args
    from tests.real_slime.gpu_step import _argv, write_model

    earlier = tmp_path / "earlier"
    _megatron_tracker(earlier, 5)
    state = earlier / "rollout" / "dressage_data_source_5.json"
    state.parent.mkdir()
    state.write_text("{}")
    shape = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    spec = {
        "hf": str(write_model(tmp_path / "hf", shape)),
        "student_load": str(tmp_path / "student_td"),
        "teacher_load": str(tmp_path / "student_td"),
        "teachers": 1, "samples": 1, "prompt": 8, "lengths": [8],
        "extra": ["--dressage-continue-from", str(earlier)],
    }  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["train.py"])
    args = parse_mopd_args(_argv(tmp_path, spec))
    assert (args.load, args.ckpt_step, args.start_rollout_id) == (str(earlier), 5, 0)
    assert args.finetune and args.no_load_optim and args.no_load_rng
    assert args.dressage_continue_state == str(state)
    _megatron_tracker(tmp_path / "save", 2)  # this run saved once, then was resubmitted
    args = parse_mopd_args(_argv(tmp_path, spec))
    assert args.load == str(tmp_path / "save") and not args.finetune
    assert args.dressage_continue_state is None
