"""Which prompt datasets a run samples from: validated once, from the run's config.

Sources, first found wins:

1. ``args.dressage_datasets``: a list of dataset entries, or that list as JSON text (set it with
   slime's ``--custom-config-path run.yaml``, whose top-level keys land on ``args``);
2. the MOPD config (``args.mopd_config``, else ``$DRESSAGE_MOPD_CONFIG``), read and
   checked by :func:`dressage.config.mopd.load_mopd_config`, its ``datasets`` list;
3. slime's own ``--prompt-data file.jsonl``: one black-box dataset named after the file.

An entry::

    {"name": "calc", "path": "data/calc.jsonl", "teacher_id": "math-teacher", "weight": 2,
     "agent_mode": "blackbox", "generate_function_path": null, "task": "calculator"}

``weight`` > 0 (default 1); ``agent_mode`` is ``blackbox`` (default) or ``whitebox``, and a
whitebox dataset must name its ``generate_function_path`` (set on every sample's
``Sample.generate_function_path``; slime prefers it over ``--custom-generate-function-path``).
``task`` (optional) names the reward function (dressage.reward.registry) of its rows, and
``input_key``/``label_key``/``metadata_key`` override slime's ``--input-key`` (``input``),
``--label-key`` (here ``label``) and ``--metadata-key`` (``metadata``) for one dataset.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_validator

from dressage.config.mopd import DatasetOptions, load_mopd_config
from dressage.config.mopd_path import mopd_config_path
from dressage.slime.rollout_args import rollout_args

__all__ = ["AGENT_MODES", "PromptDataset", "dataset_specs", "read_rows"]

AGENT_MODES = ("blackbox", "whitebox")


class PromptDataset(DatasetOptions):
    """One prompt dataset of a run (the MOPD config's entries, with defaults where it has none)."""

    name: str
    path: str
    teacher_id: str | None = None
    weight: float = 1.0
    agent_mode: str = "blackbox"

    @model_validator(mode="after")
    def _semantics(self) -> PromptDataset:
        where = f"dataset {self.name!r}"
        if not self.name:
            raise ValueError("a dataset needs a non-empty name")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"{where}: weight must be > 0, got {self.weight}")
        if self.agent_mode not in AGENT_MODES:
            raise ValueError(
                f"{where}: unknown agent_mode {self.agent_mode!r}; expected one of {AGENT_MODES}"
            )
        if self.agent_mode == "whitebox" and not self.generate_function_path:
            raise ValueError(f"{where}: a whitebox dataset needs generate_function_path")
        return self


def _parse(entries: Iterable[Any], source: str) -> list[PromptDataset]:
    specs = []
    for k, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        try:
            specs.append(PromptDataset.model_validate(entry))
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"{source}: datasets[{k}] (name {name!r}): {detail}") from None
    if not specs:
        raise ValueError(f"{source}: no datasets")
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{source}: dataset names must be unique, repeated: {duplicates}")
    return specs


def dataset_specs(args: Any) -> list[PromptDataset]:
    """The run's datasets, from the first source that is set (see the module docstring)."""
    view = rollout_args(args)
    inline = view.dressage_datasets
    if inline:
        entries = json.loads(inline) if isinstance(inline, str) else inline
        return _parse(entries, "args.dressage_datasets")
    config_path = mopd_config_path(view.mopd_config, given_as="args.mopd_config")
    if config_path:
        config = load_mopd_config(config_path)  # raises MopdConfigError naming every problem
        entries = [d.model_dump() for d in config.datasets]
        return _parse(entries, f"MOPD config {config_path}")
    prompt_data = view.prompt_data
    if prompt_data:
        return [PromptDataset(name=Path(prompt_data).stem, path=str(prompt_data))]
    raise ValueError(
        "no prompt datasets: set args.dressage_datasets, args.mopd_config, "
        "$DRESSAGE_MOPD_CONFIG or --prompt-data"
    )


def read_rows(spec: PromptDataset) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for every row of a JSONL dataset; blank lines are skipped."""
    path = Path(spec.path)
    if not path.is_file():
        raise ValueError(f"dataset {spec.name!r}: {path} does not exist")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"dataset {spec.name!r}: {path}:{line_no}: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"dataset {spec.name!r}: {path}:{line_no}: not a JSON object")
            rows.append((line_no, row))
    if not rows:
        raise ValueError(f"dataset {spec.name!r}: {path} has no rows")
    return rows
