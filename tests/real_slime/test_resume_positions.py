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
