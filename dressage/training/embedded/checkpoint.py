"""The embedded trainer's checkpoints: slime's ``--save``, ``--save-interval`` and ``--load``.

    args = trainer_args(..., save="/run/ckpt", save_interval=10, load="/run/ckpt")
    trainer = EmbeddedTrainer(args, teachers=...)
    manager = EmbeddedRolloutManager(args, MopdDataSource(args))
    resumed = load_checkpoint(args, trainer, manager)   # sets args.start_rollout_id
    train_async(args, EmbeddedAsyncBackend(trainer, manager, ...), pause)   # saves

The layout is Megatron's, as slime writes it under ``--save``: ``iter_XXXXXXX/`` per save, the
iteration being the rollout id just trained, and the tracker ``latest_checkpointed_iteration.txt``
naming the newest. The driver saves every ``--save-interval`` rollouts, at epoch ends and after
the last (:func:`dressage.slime.periodic.periodic_action`). ``--load`` takes such a folder (or one
``iter_XXXXXXX`` folder; ``--ckpt-step`` picks an iteration) and the run resumes at the rollout
after the saved one (``args.start_rollout_id``, unless set). A checkpoint holds:

- ``model/``: the student, a Hugging Face folder (:meth:`EmbeddedTrainer.save_weights`);
- ``trainer.pt``: AdamW's state, the optimizer steps taken (the position of the learning-rate
  schedule, :meth:`EmbeddedTrainer.learning_rate`) and the RNG states (python, numpy, torch CPU
  and every CUDA device);
- ``rollout.json``: the rollout side (:meth:`EmbeddedRolloutManager.rollout_state`), below;
- ``checkpoint.json``, written last: the rollout id, the last metrics step logged (a resumed
  job's metrics log drops later records, which it writes again), the student it started from,
  the teachers, and the size of every file (the completeness check).

What of the rollout must survive. When rollout ``N`` is saved, rollout ``N + 1`` is already being
generated (the driver starts it before training ``N``) and the partial-async worker holds more
groups, generating or finished, all with prompts taken from the data source. Its position alone
(what slime's data source saves) would skip those prompts on resume. So the checkpoint keeps the
position as it was before rollout ``N + 1`` took any prompt, plus, as fresh prompt copies, the
groups handed out before then that no trained rollout holds: the data source's buffer (groups
handed back) and the worker's groups. A resumed run serves them first. Their generated tokens
are not kept: the agents' sessions end with the process that ran them, and tokens sampled by
weights older than the checkpoint's would only add staleness (the staleness bound's ``drop``
regenerates such groups the same way). Groups a dynamic-sampling filter rejected are gone, as in
slime. With the synchronous rollout a resumed run trains on the same prompts, in the same order,
as one that never stopped.

Writes are atomic: a checkpoint is written into ``.iter_XXXXXXX.tmp-<pid>`` beside its place,
every file and folder fsynced, then renamed into place; the tracker is then replaced the same
way (temp file, fsync, ``os.replace``). A save killed half-way leaves a hidden temp folder,
never chosen (the next save removes it). A folder the tracker names that is incomplete (a file
missing or of another size than ``checkpoint.json`` says) is skipped with a warning for the
newest complete one before it.

``--load`` of a folder with no checkpoint starts fresh (an info line). A checkpoint of another
model (architecture, tokenizer: :func:`dressage.training.checkpoints.same_model_problems`) or
with other teachers is refused before training, naming every difference; any other problem
names its file.

A new run can also start from an earlier run's checkpoint (:func:`continue_from_checkpoint`, the
job's ``advanced.continue_from``): the student, AdamW's state and the rollout side (the data
position and the prompts handed out but not trained) come from it, while the run's own rollout
ids, learning-rate schedule, RNG seeds and metrics start afresh. A checkpoint that is not there
is an error, never a fresh start.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dressage.config.problems import Problem
from dressage.slime.train_args import actor_args
from dressage.training.checkpoints import (
    TRACKER,
    CheckpointError,
    inspect_checkpoint,
    same_model_problems,
)

__all__ = [
    "TRACKER",
    "CheckpointMismatchError",
    "Continued",
    "Resumed",
    "checkpoint_location",
    "continue_from_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

FORMAT = 1
META, TRAINER, ROLLOUT, MODEL = "checkpoint.json", "trainer.pt", "rollout.json", "model"
_ITER = re.compile(r"iter_(\d{7})")


class CheckpointMismatchError(ValueError):
    """A checkpoint of another model or with other teachers; the message lists each difference."""


@dataclass(frozen=True)
class Resumed:
    """What :func:`load_checkpoint` restored."""

    folder: Path
    rollout_id: int
    """The rollout trained last before the save; the run goes on at the next."""
    metrics_step: int
    """The last metrics step logged before the save."""


@dataclass(frozen=True)
class Continued:
    """What :func:`continue_from_checkpoint` took from an earlier run's checkpoint."""

    folder: Path
    rollout_id: int
    """The earlier run's last trained rollout (0-based) when it saved."""
    optimizer_steps: int
    """The optimizer steps the student had taken, all runs before this one together."""
    data_position: dict[str, Any] | None
    """The data source's position this run starts at (its ``state_dict()``), None if not kept."""
    carried_groups: int
    """Prompt groups the earlier run had handed out but not trained, served first here."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": str(self.folder),
            "rollout_id": self.rollout_id,
            "optimizer_steps": self.optimizer_steps,
            "data_position": self.data_position,
            "carried_groups": self.carried_groups,
        }


# -- saving ------------------------------------------------------------------------------------


def save_checkpoint(
    root: str | Path,
    rollout_id: int,
    trainer: Any,
    rollout_state: Mapping[str, Any] | None,
    *,
    metrics_step: int | None = None,
) -> Path:
    """Write ``root/iter_<rollout_id>`` atomically, then point the tracker at it.

    ``trainer``: an :class:`~dressage.training.embedded.EmbeddedTrainer`; ``rollout_state``:
    :meth:`EmbeddedRolloutManager.rollout_state` of the next rollout (None: not kept);
    ``metrics_step``: the last step logged (default ``rollout_id``). Returns the folder.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _remove_unfinished(root)
    name = f"iter_{rollout_id:07d}"
    staging = root / f".{name}.tmp-{os.getpid()}"
    staging.mkdir()
    trainer.save_weights(staging / MODEL)
    torch.save(
        {
            "format": FORMAT,
            "optimizer": trainer.optimizer.state_dict(),
            "num_steps": int(trainer.num_steps),
            "rng": _rng_state(),
        },
        staging / TRAINER,
    )
    _write_json(staging / ROLLOUT, dict(rollout_state) if rollout_state is not None else None)
    files = {
        str(path.relative_to(staging)): path.stat().st_size
        for path in sorted(staging.rglob("*"))
        if path.is_file()
    }
    meta = {
        "format": FORMAT,
        "rollout_id": rollout_id,
        "metrics_step": rollout_id if metrics_step is None else metrics_step,
        "num_steps": int(trainer.num_steps),
        "hf_checkpoint": str(trainer.model_path),
        "teachers": {tid: str(path) for tid, path in sorted(trainer.teachers.items())},
        "files": files,
    }
    _write_json(staging / META, meta)
    _fsync_tree(staging)
    final = root / name
    old = root / f".{name}.old-{os.getpid()}"
    if final.exists():  # saved once before the resume this run started from: replaced
        final.rename(old)
    staging.rename(final)
    _fsync(root)
    shutil.rmtree(old, ignore_errors=True)
    _write_tracker(root, rollout_id)
    return final


def _remove_unfinished(root: Path) -> None:
    for leftover in root.glob(".iter_*"):
        log.info("removing %s, what an interrupted save left", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in root.glob(f".{TRACKER}.tmp-*"):
        leftover.unlink(missing_ok=True)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")


def _write_tracker(root: Path, rollout_id: int) -> None:
    tmp = root / f".{TRACKER}.tmp-{os.getpid()}"
    tmp.write_text(f"{rollout_id}\n")
    _fsync(tmp)
    os.replace(tmp, root / TRACKER)
    _fsync(root)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):  # files before their folders
        _fsync(path)
    _fsync(folder)


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            log.warning(
                "the checkpoint has the RNG states of %d CUDA devices, this process sees %d: "
                "CUDA RNG states not restored",
                len(cuda),
                torch.cuda.device_count(),
            )
        else:
            torch.cuda.set_rng_state_all(cuda)


# -- finding the latest ------------------------------------------------------------------------


def latest_checkpoint(root: str | Path, ckpt_step: int | None = None) -> Path | None:
    """The checkpoint ``--load root`` resumes from; None when ``root`` holds none.

    The tracker's iteration (``ckpt_step`` instead when given), or, when that folder is
    incomplete, the newest complete one before it, with a warning; without a tracker, the
    newest complete folder. ``root`` may also be one ``iter_XXXXXXX`` folder.

    Raises:
        CheckpointError: a tracker that names no iteration, a named checkpoint (``root`` itself
            or ``ckpt_step``) that is incomplete or absent, or a tracker with no complete
            checkpoint at or before it; the message names the file or folder.
    """
    root = Path(root)
    if _ITER.fullmatch(root.name) and root.is_dir():
        _require_complete(root)
        return root
    if not root.is_dir():
        return None
    for leftover in sorted(root.glob(".iter_*")):
        log.warning("%s: a save was killed while writing it; ignored", leftover)
    folders = {
        int(m.group(1)): p
        for p in root.iterdir()
        if (m := _ITER.fullmatch(p.name)) is not None and p.is_dir()
    }
    if ckpt_step is not None:
        if ckpt_step not in folders:
            raise CheckpointError(f"{root} has no iter_{ckpt_step:07d}/ (--ckpt-step {ckpt_step})")
        _require_complete(folders[ckpt_step])
        return folders[ckpt_step]
    named = _tracker_iteration(root)
    for iteration in sorted(folders, reverse=True):
        if named is not None and iteration > named:
            continue  # renamed into place, but the tracker (the commit) was not updated
        folder = folders[iteration]
        reason = _incomplete(folder)
        if reason is not None:
            log.warning("%s is incomplete (%s): skipped", folder, reason)
            continue
        if named is not None and iteration != named:
            log.warning(
                "%s names iter_%07d, which is missing or incomplete: resuming from %s, the "
                "newest complete checkpoint before it",
                root / TRACKER,
                named,
                folder.name,
            )
        elif named is None:
            log.warning("%s has no %s: resuming from %s, its newest", root, TRACKER, folder.name)
        return folder
    if named is not None:
        raise CheckpointError(
            f"{root / TRACKER} names iter_{named:07d}, and no checkpoint at or before it is "
            "complete (see the warnings); remove the folder to start fresh"
        )
    return None


def _tracker_iteration(root: Path) -> int | None:
    tracker = root / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker} holds {text!r}, not an iteration")
    return int(text)


def _incomplete(folder: Path) -> str | None:
    """Why ``folder`` is not a whole checkpoint (None when it is)."""
    meta_path = folder / META
    if not meta_path.is_file():
        return f"no {META}"
    try:
        files = json.loads(meta_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{META} unreadable: {exc}"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
    return None


def _require_complete(folder: Path) -> None:
    reason = _incomplete(folder)
    if reason is not None:
        raise CheckpointError(f"{folder} is incomplete: {reason}")


# -- loading -----------------------------------------------------------------------------------


def load_checkpoint(args: Any, trainer: Any, rollout_manager: Any = None) -> Resumed | None:
    """Resume from ``args.load`` (see the module docstring); None: nothing to load, fresh.

    Restores the student's weights, the optimizer, the schedule's position and the RNG states
    into ``trainer``, the rollout state into ``rollout_manager`` (when given), and sets
    ``args.start_rollout_id`` to the rollout after the saved one unless it is set.

    Raises:
        CheckpointMismatchError: another model or other teachers.
        CheckpointError: a file of the checkpoint cannot be read or does not fit.
    """
    view = actor_args(args)
    root = view.load
    if not root:
        return None
    folder = latest_checkpoint(root, view.ckpt_step)
    if folder is None:
        log.info("--load %s holds no checkpoint: training starts from %s", root, trainer.model_path)
        return None
    meta, state, _ = _restore(folder, trainer, rollout_manager, "--load")
    trainer.num_steps = int(state["num_steps"])
    _set_rng_state(state["rng"])
    rollout_id = int(meta["rollout_id"])
    if view.start_rollout_id is None:
        args.start_rollout_id = rollout_id + 1
    log.info(
        "resumed from %s: rollout %d, %d optimizer steps", folder, rollout_id, trainer.num_steps
    )
    return Resumed(folder, rollout_id, int(meta.get("metrics_step", rollout_id)))


def checkpoint_location(text: str) -> Path:
    """The folder a ``continue_from`` value names: a path, or a ``file://`` URL.

    Raises:
        CheckpointError: another URL scheme (the checkpoint must be on this machine's disk).
    """
    from urllib.parse import unquote, urlparse

    value = text.strip()
    if "://" not in value:
        return Path(value).expanduser()
    url = urlparse(value)
    if url.scheme != "file":
        raise CheckpointError(
            f"continue_from {value!r}: only a folder or a file:// URL can be continued from, "
            f"not {url.scheme}://"
        )
    return Path(unquote(url.path))


def continue_from_checkpoint(
    source: str | Path, trainer: Any, rollout_manager: Any = None
) -> Continued:
    """Start a new run from an earlier run's checkpoint (see the module docstring).

    ``source``: a ``checkpoints/`` folder (its newest complete checkpoint), one
    ``iter_XXXXXXX`` folder, or a ``file://`` URL of either.

    Raises:
        CheckpointError: no checkpoint there, or a file of it cannot be read or does not fit.
        CheckpointMismatchError: another model or other teachers.
    """
    root = checkpoint_location(str(source))
    if not root.exists():
        raise CheckpointError(f"continue_from {source}: no such folder")
    folder = latest_checkpoint(root)
    if folder is None:
        raise CheckpointError(f"continue_from {source}: the folder holds no checkpoint")
    meta, state, rollout = _restore(folder, trainer, rollout_manager, "continue_from")
    log.info("continuing from %s: rollout %d of an earlier run", folder, int(meta["rollout_id"]))
    return Continued(
        folder=folder,
        rollout_id=int(meta["rollout_id"]),
        optimizer_steps=int(state["num_steps"]),
        data_position=(rollout or {}).get("data_source"),
        carried_groups=len((rollout or {}).get("groups") or []),
    )


def _restore(
    folder: Path, trainer: Any, rollout_manager: Any, what: str
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Check ``folder`` against this run, then load the student, AdamW's state and the rollout
    state (into ``rollout_manager`` when given); its (meta, trainer state, rollout state)."""
    meta = _read_json(folder / META)
    problems = _mismatches(folder, meta, trainer)
    if problems:
        raise CheckpointMismatchError(
            f"{what} {folder} was saved by another model or config:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    try:
        trainer.load_weights(folder / MODEL)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / MODEL}: {exc}") from exc
    state = _read_trainer_state(folder / TRAINER)
    try:
        trainer.optimizer.load_state_dict(state["optimizer"])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{folder / TRAINER}: optimizer state does not fit: {exc}") from exc
    rollout = _read_json(folder / ROLLOUT)
    if rollout_manager is not None and hasattr(rollout_manager, "load_rollout_state"):
        try:
            rollout_manager.load_rollout_state(rollout)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{folder / ROLLOUT}: {exc}") from exc
    return meta, state, rollout


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from exc


def _read_trainer_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a damaged or foreign file
        raise CheckpointError(f"{path}: {type(exc).__name__}: {exc}") from exc
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {state.get('format')!r}, expected {FORMAT}")
    return state


def _mismatches(folder: Path, meta: Mapping[str, Any], trainer: Any) -> list[Problem]:
    """Every way the checkpoint's model and teachers differ from this run's."""
    subject = f"checkpoint {folder.name}"
    try:
        saved = inspect_checkpoint(folder / MODEL)
        student = inspect_checkpoint(trainer.model_path)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from exc
    problems = same_model_problems(subject, saved, student)
    teachers = {tid: str(path) for tid, path in trainer.teachers.items()}
    saved_teachers: dict[str, str] = dict(meta.get("teachers") or {})
    for tid in sorted(set(saved_teachers) | set(teachers)):
        before, now = saved_teachers.get(tid), teachers.get(tid)
        if before != now:
            problems.append(
                Problem(
                    f"{subject} teacher {tid!r}",
                    f"saved with {before or 'no such teacher'}, this run has "
                    f"{now or 'no such teacher'}",
                )
            )
    return problems
