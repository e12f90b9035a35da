"""A resubmitted job logs to the W&B run its first submission started.

slime's driver starts a new W&B run at every launch (``init_tracking``: ``wandb.init`` with no
run id). When a crashed job is submitted again, it resumes its checkpoint (``--load`` at its
``--save``) but would start a second W&B run. :func:`keep_wandb_run` gives the job one run id,
kept in its save folder: the first launch writes one, every later launch of the same job reads
it, and W&B's own environment variables (``WANDB_RUN_ID``, ``WANDB_RESUME=allow``) make
slime's ``wandb.init`` continue that run. A run id the user set in ``WANDB_RUN_ID`` wins. A new
run that continues an earlier one's checkpoint (``--dressage-continue-from``) has a save folder
of its own, so a W&B run of its own.

The steps between the last checkpoint and the crash are trained again after a resume; W&B
shows them twice on the ``train/step`` axis.
"""

from __future__ import annotations

import os
import secrets
import string
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["RUN_ID_FILE", "keep_wandb_run"]

RUN_ID_FILE = "wandb_run_id.txt"
"""The file in ``--save`` that holds the job's W&B run id."""
_ALPHABET = string.ascii_lowercase + string.digits  # W&B's own ids: 8 of these


def keep_wandb_run(args: Any, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``WANDB_RUN_ID`` and ``WANDB_RESUME`` so that slime's W&B run is this job's one run;
    returns the id (None when the job does not use W&B or has no ``--save`` folder)."""
    env = os.environ if environ is None else environ
    if not getattr(args, "use_wandb", False) or not getattr(args, "save", None):
        return None
    if env.get("WANDB_RUN_ID"):
        run_id = env["WANDB_RUN_ID"]
    else:
        path = Path(args.save) / RUN_ID_FILE
        if path.is_file() and path.read_text().strip():
            run_id = path.read_text().strip()
        else:
            run_id = "".join(secrets.choice(_ALPHABET) for _ in range(8))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(run_id + "\n")
            tmp.replace(path)
        env["WANDB_RUN_ID"] = run_id
    env.setdefault("WANDB_RESUME", "allow")
    return run_id
