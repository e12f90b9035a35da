"""A slime data source over several JSONL datasets, interleaved by smooth weighted round robin.

    --data-source-path dressage.rollout.data_source.MopdDataSource

(named for the MOPD runs that need several datasets; it serves any run, RL included).

slime constructs it as ``cls(args)`` and uses the ``DataSource`` surface (docs/slime.md
§1.4): ``get_samples(num_samples)`` returns ``num_samples`` groups of ``n_samples_per_prompt``
deep copies of one prompt, each group with its own ``group_index`` and each copy a fresh
global ``index`` (``rollout_id`` is left to the generate function); ``add_samples`` buffers
groups handed back (partial rollout), served first; ``save``/``load`` keep the position so a
resumed run continues the same sequence; ``len`` is the number of prompts per epoch.

The datasets (dressage.rollout.dataset_specs) are picked by smooth weighted round robin (the
nginx scheme): a deterministic interleave in which, over any window, each dataset's share
follows its weight as closely as integers allow (weights 2:1 give a, b, a, a, b, a, ...).
Within a dataset rows run in file order, or reshuffled every epoch with ``--rollout-shuffle``
(seeded by ``--rollout-seed``, the dataset name and the epoch). Each sample's metadata carries
``dataset`` (also as slime's ``source_name``), ``instance_id``, ``agent_mode`` and, when the
dataset names one, ``teacher_id``; ``Sample.generate_function_path`` is the dataset's.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from dressage.rollout.dataset_specs import PromptDataset, dataset_specs, read_rows
from dressage.slime.rollout_args import rollout_args
from dressage.slime.sample_meta import (
    AGENT_MODE,
    DATASET,
    INSTANCE_ID,
    SOURCE_NAME,
    TASK,
    TEACHER_ID,
)
from dressage.types import Sample

__all__ = ["MopdDataSource", "SmoothWeightedRoundRobin"]

STATE_VERSION = 1


class SmoothWeightedRoundRobin:
    """Deterministic weighted interleave: each pick adds every weight to its running score,
    takes the highest score (the first on ties) and subtracts the total from it."""

    def __init__(self, weights: dict[str, float]) -> None:
        if not weights:
            raise ValueError("round robin needs at least one weight")
        self.weights = dict(weights)
        self.total = sum(self.weights.values())
        self.current = dict.fromkeys(self.weights, 0.0)

    def next(self) -> str:
        for name, weight in self.weights.items():
            self.current[name] += weight
        best = max(self.current, key=lambda name: self.current[name])
        self.current[best] -= self.total
        return best


class _Cursor:
    """Position in one dataset: epoch and offset into that epoch's row order."""

    def __init__(self, size: int, name: str, shuffle: bool, seed: int) -> None:
        self.size, self.name, self.shuffle, self.seed = size, name, shuffle, seed
        self.epoch, self.offset = 0, 0
        self.order = self._order()

    def _order(self) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.name}:{self.epoch}").shuffle(order)
        return order

    def next(self) -> int:
        if self.offset == self.size:
            self.epoch, self.offset = self.epoch + 1, 0
            self.order = self._order()
        row = self.order[self.offset]
        self.offset += 1
        return row

    def restore(self, epoch: int, offset: int) -> None:
        if not 0 <= offset <= self.size:
            raise ValueError(f"dataset {self.name!r}: saved offset {offset} outside its rows")
        self.epoch, self.offset = epoch, offset
        self.order = self._order()


def _key(own: str | None, flag: str | None, default: str) -> str:
    """A dataset's row key: its own, else the slime flag's, else ``default``."""
    return str(own or flag or default)


class MopdDataSource:
    """slime ``DataSource`` over the run's datasets (see the module docstring)."""

    def __init__(self, args: Any) -> None:
        self.args = args
        view = rollout_args(args)
        self.n_samples_per_prompt = view.n_samples_per_prompt
        self.specs = {spec.name: spec for spec in dataset_specs(args)}
        self.rows = {name: read_rows(spec) for name, spec in self.specs.items()}
        shuffle, seed = view.rollout_shuffle, view.rollout_seed
        self.cursors = {
            name: _Cursor(len(rows), name, shuffle, seed) for name, rows in self.rows.items()
        }
        self.round_robin = SmoothWeightedRoundRobin(
            {name: spec.weight for name, spec in self.specs.items()}
        )
        self.group_index = 0
        self.sample_index = 0
        self.buffer: list[list[Sample]] = []

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.rows.values())

    # -- sampling -------------------------------------------------------------------------------

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """``num_samples`` groups: buffered groups first, then fresh prompts."""
        groups = self.buffer[:num_samples]
        del self.buffer[:num_samples]
        while len(groups) < num_samples:
            groups.append(self._new_group())
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> None:
        for k, group in enumerate(samples):
            if len(group) != self.n_samples_per_prompt:
                raise ValueError(
                    f"add_samples: group {k} has {len(group)} entries, expected "
                    f"n_samples_per_prompt={self.n_samples_per_prompt}"
                )
        self.buffer.extend(samples)

    def _new_group(self) -> list[Sample]:
        name = self.round_robin.next()
        line_no, row = self.rows[name][self.cursors[name].next()]
        template = self._template(self.specs[name], line_no, row)
        group = []
        for _ in range(self.n_samples_per_prompt):
            sample = copy.deepcopy(template)
            sample.group_index, sample.index = self.group_index, self.sample_index
            self.sample_index += 1
            group.append(sample)
        self.group_index += 1
        return group

    def _template(self, spec: PromptDataset, line_no: int, row: dict[str, Any]) -> Sample:
        where = f"dataset {spec.name!r} line {line_no}"
        view = rollout_args(self.args)
        input_key = _key(spec.input_key, view.input_key, "input")
        if input_key not in row:
            raise ValueError(f"{where}: no prompt under the input key {input_key!r}")
        metadata = _row_metadata(
            row.get(_key(spec.metadata_key, view.metadata_key, "metadata")), where
        )
        tool_key = view.tool_key
        if tool_key and tool_key in row:
            metadata["tools"] = row[tool_key]
        instance = metadata.get(INSTANCE_ID) or row.get("instance_id") or row.get("id")
        metadata[INSTANCE_ID] = str(instance) if instance is not None else f"{spec.name}:{line_no}"
        metadata.update({DATASET: spec.name, SOURCE_NAME: spec.name, AGENT_MODE: spec.agent_mode})
        if spec.teacher_id is not None:
            metadata[TEACHER_ID] = spec.teacher_id
        if spec.task is not None:
            metadata.setdefault(TASK, spec.task)
        label = row.get(_key(spec.label_key, view.label_key, "label"))
        return Sample(
            prompt=row[input_key],
            label=None if label is None else str(label),
            metadata=metadata,
            generate_function_path=spec.generate_function_path,
        )

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "datasets": {
                name: {"epoch": c.epoch, "offset": c.offset} for name, c in self.cursors.items()
            },
            "round_robin": dict(self.round_robin.current),
            "group_index": self.group_index,
            "sample_index": self.sample_index,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved, current = sorted(state["datasets"]), sorted(self.cursors)
        if saved != current:
            raise ValueError(
                f"data source state is for datasets {saved}, this run has {current}: the "
                "sequence cannot be resumed"
            )
        for name, position in state["datasets"].items():
            self.cursors[name].restore(int(position["epoch"]), int(position["offset"]))
        self.round_robin.current = {k: float(v) for k, v in state["round_robin"].items()}
        self.group_index = int(state["group_index"])
        self.sample_index = int(state["sample_index"])

    def save(self, rollout_id: int) -> None:
        """Write the position under ``args.save`` (no-op without it); the buffer is not kept."""
        root = rollout_args(self.args).save
        if not root:
            return
        path = _state_path(root, rollout_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state_dict(), indent=1))
        tmp.replace(path)  # atomic: a crash never leaves half a state file

    def load(self, rollout_id: int | None = None) -> None:
        """Restore from ``args.load``: the given rollout's state, else the latest saved one.

        At a run's start (slime asks for rollout ``start_rollout_id - 1``, -1 for a run that
        starts from nothing of its own) a run continuing an earlier one
        (``--dressage-continue-from``, :mod:`dressage.slime.continue_from`) takes the position
        that run saved with its checkpoint."""
        view = rollout_args(self.args)
        continued = view.dressage_continue_state
        if continued and rollout_id is not None and rollout_id < 0:
            self.load_state_dict(json.loads(Path(continued).read_text()))
            return
        root = view.load
        if not root:
            return
        if rollout_id is None:
            saved = sorted(Path(root, "rollout").glob("dressage_data_source_*.json"))
            ids = [int(p.stem.rsplit("_", 1)[1]) for p in saved]
            if not ids:
                return
            rollout_id = max(ids)
        path = _state_path(root, rollout_id)
        if path.is_file():
            self.load_state_dict(json.loads(path.read_text()))


def _state_path(root: str, rollout_id: int) -> Path:
    return Path(root) / "rollout" / f"dressage_data_source_{rollout_id}.json"


def _row_metadata(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"{where}: metadata must be an object, got {type(value).__name__}")
    return dict(value)
