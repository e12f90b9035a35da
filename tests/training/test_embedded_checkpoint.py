"""The embedded trainer's checkpoints (slime's --save / --save-interval / --load): what one holds
comes back whole, a resumed run equals one that never stopped, torn saves are never chosen, and a
checkpoint of another model or config is refused naming the difference.

The rollout is a stand-in that needs no engine: each group's tokens and rewards follow from its
prompt (a row of a real :class:`MopdDataSource`, shuffled), so any prompt skipped or served twice
on resume changes the losses."""

from __future__ import annotations

import json
import logging
import random
import shutil
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dressage.rollout.data_source import MopdDataSource
from dressage.tiny import TinyModelSpec, tiny_model_dir
from dressage.training.checkpoints import CheckpointError
from dressage.training.embedded import EmbeddedTrainer, trainer_args
from dressage.training.embedded.async_backend import EmbeddedAsyncBackend, RolloutBatch
from dressage.training.embedded.checkpoint import (
    TRACKER,
    CheckpointMismatchError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from dressage.training.embedded.rollout import EmbeddedRolloutManager
from dressage.training.metrics_sink import MetricsSink
from dressage.training.proxy_pause_client import RolloutPause
from dressage.training.train_async_with_rollout_pause import train_async
from dressage.types import RolloutFnTrainOutput, Sample

pytestmark = pytest.mark.unit

SPEC = TinyModelSpec(vocab="qwen3.5-tasks")  # 704-token vocabulary: a 0.5 MB model
ROWS = 7  # fewer than a run's prompts: the position crosses an epoch


def fake_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """One rollout without an engine: tokens and rewards are functions of each group's prompt."""
    groups = data_source.get_samples(int(args.rollout_batch_size))
    for group in groups:
        k = int(group[0].label)
        for j, sample in enumerate(group):
            sample.tokens = [1 + (k * 37 + i * 11 + j * 5) % 700 for i in range(7)]
            sample.response_length = 4
            sample.loss_mask = [1, 1, 1, 1]
            sample.rollout_log_probs = [-1.0] * 4
            sample.reward = float((k + j) % 2)
            sample.rollout_id = sample.index
            sample.session_id = f"s{sample.index}"
            sample.status = Sample.Status.COMPLETED
    return RolloutFnTrainOutput(samples=groups, metrics={})


@pytest.fixture
def dataset(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"input": f"q{k}", "label": str(k)}) + "\n" for k in range(ROWS))
    )
    return [{"name": "prompts", "path": str(path)}]


def _args(dataset: list[dict[str, Any]], root: Path, **options: Any) -> Namespace:
    values: dict[str, Any] = {
        "hf_checkpoint": str(tiny_model_dir(SPEC)),
        "device": "cpu",
        "lr": 3e-3,
        "lr_decay_style": "linear",
        "lr_warmup_iters": 2,
        "global_batch_size": 4,
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "num_rollout": 5,
        "dressage_datasets": dataset,
        "rollout_shuffle": True,
        "rollout_seed": 3,
        "save": str(root),
        "save_interval": 2,
        "load": str(root),
    }
    return trainer_args(**(values | options))


def _build(args: Namespace, **trainer_options: Any) -> tuple[EmbeddedTrainer, Any]:
    trainer = EmbeddedTrainer(args, **trainer_options)
    manager = EmbeddedRolloutManager(args, MopdDataSource(args), rollout_fn=fake_rollout)
    return trainer, manager


def _prompts(train_data: dict[str, Any]) -> list[list[int]]:
    return [list(t) for t in train_data["tokens"]]


def _params(trainer: EmbeddedTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _rng_draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def _train(trainer: EmbeddedTrainer, manager: Any, rollouts: range) -> None:
    for rid in rollouts:
        train_data, _, _ = manager.generate(rid)
        trainer.train(rid, train_data)


def test_a_checkpoint_brings_back_everything_it_holds(
    dataset: list[dict[str, Any]], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    trainer, manager = _build(_args(dataset, root))
    _train(trainer, manager, range(3))
    # as the driver does: rollout 3 is generated (its prompts taken) before rollout 2 is saved
    upcoming, _, _ = manager.generate(3)
    torch.manual_seed(11)
    folder = save_checkpoint(root, 2, trainer, manager.rollout_state(3))
    draws = _rng_draws()
    assert folder == root / "iter_0000002" and (root / TRACKER).read_text() == "2\n"

    args = _args(dataset, root)
    fresh, fresh_manager = _build(args)
    resumed = load_checkpoint(args, fresh, fresh_manager)
    assert resumed is not None and (resumed.rollout_id, resumed.metrics_step) == (2, 2)
    assert args.start_rollout_id == 3
    assert _rng_draws() == draws
    before, after = _params(trainer), _params(fresh)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert fresh.num_steps == trainer.num_steps == 3
    assert fresh.learning_rate(fresh.num_steps) == trainer.learning_rate(trainer.num_steps)
    saved, loaded = trainer.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    for i, state in saved["state"].items():
        for key, value in state.items():
            assert torch.equal(value, loaded["state"][i][key]), (i, key)
    # the data position is the one before rollout 3 took its prompts
    again, _, _ = fresh_manager.generate(3)
    assert _prompts(again) == _prompts(upcoming)
    assert fresh_manager.data_source.state_dict() == manager.data_source.state_dict()


Run = tuple[dict[int, dict[str, float]], dict[str, torch.Tensor]]


def _run(args: Namespace, out: Path, *, crash_at: int | None = None, resume: bool = False) -> Run:
    """The async driver over the embedded backend (no engine: the weight push is a no-op);
    ``(train metrics by rollout, final parameters)``. ``crash_at``: killed after that rollout
    trained and logged its metrics, before its save."""
    trainer, manager = _build(args)
    resumed = load_checkpoint(args, trainer, manager) if resume else None
    assert (resumed is not None) == resume
    sink = MetricsSink(
        out / "metrics.jsonl", keep_through=resumed.metrics_step if resumed else None
    )
    trained: dict[int, dict[str, float]] = {}

    def on_trained(batch: RolloutBatch, metrics: dict[str, float]) -> None:
        sink.log(batch.rollout_id, {"pg_loss": metrics["train/pg_loss"]})
        trained[batch.rollout_id] = metrics
        if batch.rollout_id == crash_at:
            raise KeyboardInterrupt("killed")

    backend = EmbeddedAsyncBackend(
        trainer=trainer,
        rollout_manager=manager,
        engine_url="http://unused",
        weights_dir=out / "weights",
        update_engine_weights=lambda *_: None,
        on_trained=on_trained,
        version=0,
    )
    try:
        train_async(args, backend, RolloutPause(proxy_url=None, enabled=False))
    finally:
        backend.dispose()
        sink.close()
    return trained, _params(trainer)


def test_training_straight_equals_crashing_and_resuming(
    dataset: list[dict[str, Any]], tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    straight, straight_params = _run(_args(dataset, a / "ckpt"), a)

    with pytest.raises(KeyboardInterrupt):
        _run(_args(dataset, b / "ckpt", load=None), b, crash_at=3)
    assert latest_checkpoint(b / "ckpt") == b / "ckpt" / "iter_0000001"  # saves: 1, (3)
    resumed, resumed_params = _run(_args(dataset, b / "ckpt"), b, resume=True)

    assert sorted(resumed) == [2, 3, 4]
    for rid in (2, 3, 4):
        for key in ("train/pg_loss", "train/grad_norm", "train/lr"):
            assert resumed[rid][key] == pytest.approx(straight[rid][key], rel=1e-5, abs=1e-7)
    for name, value in straight_params.items():
        assert torch.allclose(resumed_params[name], value, atol=1e-6), name
    records = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4], "no step twice, none skipped"
    assert (b / "ckpt" / TRACKER).read_text() == "4\n"


@pytest.fixture
def saved(dataset: list[dict[str, Any]], tmp_path: Path) -> Path:
    """Checkpoints of rollouts 1 and 3 under one --save folder."""
    root = tmp_path / "ckpt"
    trainer, manager = _build(_args(dataset, root))
    for rid in range(4):
        _train(trainer, manager, range(rid, rid + 1))
        if rid in (1, 3):
            save_checkpoint(root, rid, trainer, manager.rollout_state(rid + 1))
    return root


def test_a_save_killed_while_writing_is_never_chosen(
    saved: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copytree(saved / "iter_0000003", saved / ".iter_0000005.tmp-4242")  # killed mid-save
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(saved) == saved / "iter_0000003"
    assert ".iter_0000005.tmp-4242: a save was killed while writing it; ignored" in caplog.text


@pytest.mark.parametrize("damage", ["truncated", "no_meta", "missing"])
def test_a_torn_latest_checkpoint_falls_back_to_the_one_before_with_a_warning(
    saved: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    latest = saved / "iter_0000003"
    if damage == "truncated":
        with (latest / "trainer.pt").open("r+b") as handle:
            handle.truncate(100)
    elif damage == "no_meta":
        (latest / "checkpoint.json").unlink()
    else:
        shutil.rmtree(latest)
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(saved) == saved / "iter_0000001"
    assert "names iter_0000003, which is missing or incomplete: resuming from iter_0000001" in (
        caplog.text
    )
    if damage == "truncated":
        assert "trainer.pt has 100 bytes" in caplog.text


def test_a_tracker_without_a_complete_checkpoint_or_a_damaged_file_is_an_error_naming_it(
    saved: Path, dataset: list[dict[str, Any]]
) -> None:
    (saved / TRACKER).write_text("latest\n")
    with pytest.raises(CheckpointError, match=f"{TRACKER} holds 'latest'"):
        latest_checkpoint(saved)
    (saved / TRACKER).write_text("3\n")
    trainer_pt = saved / "iter_0000003" / "trainer.pt"
    trainer_pt.write_bytes(b"\0" * trainer_pt.stat().st_size)  # the right size, not a torch file
    args = _args(dataset, saved)
    with pytest.raises(CheckpointError, match=r"iter_0000003/trainer\.pt: "):
        load_checkpoint(args, *_build(args))
    for folder in ("iter_0000001", "iter_0000003"):
        (saved / folder / "checkpoint.json").unlink()
    with pytest.raises(CheckpointError, match="names iter_0000003, and no checkpoint"):
        latest_checkpoint(saved)


@pytest.mark.parametrize("where", ["empty", "absent"])
def test_load_of_a_folder_without_a_checkpoint_starts_fresh(
    dataset: list[dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    root = tmp_path / "ckpt"
    if where == "empty":
        root.mkdir()
    args = _args(dataset, root)
    trainer, manager = _build(args)
    before = _params(trainer)
    with caplog.at_level(logging.INFO):
        assert load_checkpoint(args, trainer, manager) is None
    assert f"--load {root} holds no checkpoint: training starts from" in caplog.text
    assert args.start_rollout_id is None and trainer.num_steps == 0
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def _other_tokenizer(tmp_path: Path) -> Path:
    """The student's folder with one token's text changed: same shapes, other ids."""
    folder = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir(SPEC), folder)
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    token = next(t for t, i in vocab.items() if i == 300)
    vocab["renamed_token"] = vocab.pop(token)
    path.write_text(json.dumps(tokenizer))
    return folder


@pytest.mark.parametrize("other", ["architecture", "tokenizer", "teachers"])
def test_a_checkpoint_of_another_model_or_config_is_refused_naming_the_difference(
    saved: Path, dataset: list[dict[str, Any]], tmp_path: Path, other: str
) -> None:
    options: dict[str, Any] = {}
    trainer_options: dict[str, Any] = {}
    if other == "architecture":
        options["hf_checkpoint"] = str(
            tiny_model_dir(TinyModelSpec(vocab=SPEC.vocab, hidden_size=32))
        )
        expected = r"checkpoint iter_0000003: hidden_size 64 != student's 32"
    elif other == "tokenizer":
        options["hf_checkpoint"] = str(_other_tokenizer(tmp_path))
        expected = r"checkpoint iter_0000003: tokenizer differs from the student's"
    else:
        trainer_options["teachers"] = {"math": tiny_model_dir(SPEC)}
        expected = r"checkpoint iter_0000003 teacher 'math': saved with no such teacher"
    args = _args(dataset, saved, **options)
    trainer, manager = _build(args, **trainer_options)
    before = _params(trainer)
    with pytest.raises(CheckpointMismatchError, match=expected):
        load_checkpoint(args, trainer, manager)
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert args.start_rollout_id is None


def test_the_prompts_the_partial_async_worker_holds_are_served_first_after_a_resume(
    dataset: list[dict[str, Any]], tmp_path: Path
) -> None:
    from dressage.rollout import partial_async_rollout as par
    from tests.rollout import partial_async_hooks as hooks

    hook_args = vars(hooks.rollout_args(dressage_async_max_groups_ahead=4))
    args = _args(dataset, tmp_path, **hook_args)
    source = MopdDataSource(args)
    manager = EmbeddedRolloutManager(args, source, rollout_fn=par.generate_rollout_partial_async)
    try:
        trained = [g[0].group_index for g in manager.rollout_fn(args, 0, source).samples]
        state = manager.rollout_state(1)  # the worker holds groups, generating or finished
    finally:
        par.stop_partial_async_workers()
    assert state is not None
    held = [g[0]["group_index"] for g in state["groups"]]
    assert held and not set(held) & set(trained)

    fresh = EmbeddedRolloutManager(args, MopdDataSource(args), rollout_fn=fake_rollout)
    fresh.load_rollout_state(json.loads(json.dumps(state)))  # as checkpoint.json stores it
    served = [g[0].group_index for g in fresh.data_source.get_samples(len(held) + 2)]
    assert served[: len(held)] == held, "the held prompts first, as fresh copies"
    assert sorted(trained + served) == list(range(len(trained) + len(served))), "none skipped"


def test_save_interval_without_save_is_refused_as_slime_does(
    dataset: list[dict[str, Any]], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="--save-interval 2 needs --save"):
        EmbeddedTrainer(_args(dataset, tmp_path, save=None))
