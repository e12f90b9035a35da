"""A slime run that starts from an earlier run's checkpoint: ``--dressage-continue-from``.

Both cluster drivers (MOPD's ``dressage.training.mopd_train`` and the paused async GRPO driver)
take the flag; a job's ``advanced.continue_from`` (the training DAGs' ``continue_from`` Param)
sets it::

    --dressage-continue-from /runs/nightly-0412/output/checkpoints          # its latest
    --dressage-continue-from /runs/nightly-0412/output/checkpoints/iter_0000049

What it means, after slime's own argument checks (:func:`apply_continue_from`):

- A run that has a checkpoint of its own at ``--save`` resumes that one, as slime does; the
  flag is then ignored (a resubmitted job continues itself, never the earlier run again).
- Otherwise the student's weights come from the named checkpoint, loaded the way slime loads
  ``--ref-load`` for a run with nothing saved: Megatron's ``--finetune``, so without the
  earlier run's optimizer state and RNG, and with this run's rollout ids starting at 0 (its
  learning-rate schedule and metrics start afresh too).
- The data source (``MopdDataSource``) starts at the position the earlier run saved with that
  checkpoint (``rollout/dressage_data_source_<iteration>.json`` under its root), so the new run
  hands out the prompts the earlier one would have handed out next.

A folder that is not a Megatron checkpoint, a tracker that names a missing iteration, or a
checkpoint saved without its data position is refused in one sentence naming the path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dressage.slime.torch_dist import TRACKER_FILE as TRACKER

__all__ = [
    "CONTINUE_FLAG",
    "ContinueError",
    "add_continue_argument",
    "apply_continue_from",
    "megatron_checkpoint",
]

CONTINUE_FLAG = "--dressage-continue-from"
_ITER = re.compile(r"iter_(\d{7})")


class ContinueError(ValueError):
    """The checkpoint to continue from is not there or not usable; the message names the path."""


def add_continue_argument(parser: Any) -> None:
    """Register ``--dressage-continue-from`` on a slime parser (or argument group)."""
    parser.add_argument(
        CONTINUE_FLAG,
        dest="dressage_continue_from",
        default=None,
        metavar="CHECKPOINT",
        help="start from an earlier run's slime checkpoint (its root, or one iter_XXXXXXX "
        "folder): the student's weights (Megatron's --finetune) and the data source's saved "
        "position; ignored when --save already holds this run's own checkpoint",
    )


def megatron_checkpoint(path: str | Path) -> tuple[Path, int]:
    """(root, iteration) of the Megatron checkpoint ``path`` names: a root with a tracker file
    (its latest iteration), or one ``iter_XXXXXXX`` folder of a root.

    Raises:
        ContinueError: ``path`` is neither, or the iteration's folder is missing.
    """
    path = Path(path)
    match = _ITER.fullmatch(path.name)
    if match:
        root, iteration = path.parent, int(match.group(1))
    else:
        tracker = path / TRACKER
        if not tracker.is_file():
            what = "does not exist" if not path.exists() else f"has no {TRACKER}"
            raise ContinueError(
                f"{CONTINUE_FLAG} {path} {what}: name a slime run's checkpoint folder (its "
                "--save) or one of its iter_XXXXXXX folders"
            )
        text = tracker.read_text().strip()
        if not text.isdigit():
            raise ContinueError(
                f"{tracker} says {text!r}, not an iteration: a converted model ('release') "
                f"is a --ref-load, not a run to continue"
            )
        root, iteration = path, int(text)
    folder = root / f"iter_{iteration:07d}"
    if not folder.is_dir():
        raise ContinueError(f"{CONTINUE_FLAG} {path}: {folder} does not exist")
    return root, iteration


def data_state_path(root: Path, iteration: int) -> Path:
    """Where ``MopdDataSource.save`` put its position with the checkpoint of ``iteration``."""
    return root / "rollout" / f"dressage_data_source_{iteration}.json"


def _has_own_checkpoint(args: Any) -> bool:
    save = getattr(args, "save", None)
    return save is not None and (Path(save) / TRACKER).is_file()


def apply_continue_from(args: Any) -> None:
    """Point slime's load at the checkpoint ``--dressage-continue-from`` names (see the module
    docstring); call it on slime's parsed arguments, before any actor exists.

    Sets ``args.load`` and ``args.ckpt_step`` to that checkpoint with ``finetune``,
    ``no_load_optim`` and ``no_load_rng`` (slime's own settings for a run that starts from
    ``--ref-load``), ``start_rollout_id`` to 0, and ``args.dressage_continue_state`` to the data
    source's saved position, which ``MopdDataSource.load`` reads at the start.

    Raises:
        ContinueError: the checkpoint or its data position is missing (names the path).
    """
    value = getattr(args, "dressage_continue_from", None)
    args.dressage_continue_state = None
    if not value or _has_own_checkpoint(args):
        return
    root, iteration = megatron_checkpoint(value)
    state = data_state_path(root, iteration)
    if not state.is_file():
        raise ContinueError(
            f"{CONTINUE_FLAG} {value}: {state} does not exist, so the data position of "
            f"iteration {iteration} is unknown (was the checkpoint written by a run whose data "
            "source is dressage.rollout.data_source.MopdDataSource?)"
        )
    args.load, args.ckpt_step = str(root), iteration
    args.finetune, args.no_load_optim, args.no_load_rng = True, True, True
    args.start_rollout_id = 0
    args.dressage_continue_state = str(state)
