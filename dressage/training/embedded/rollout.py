"""The embedded rollout manager: slime's RolloutManager role, for one process.

    manager = EmbeddedRolloutManager(args, MopdDataSource(args))
    for rollout_id in range(num_rollout):
        train_data, samples, metrics = manager.generate(rollout_id)
        trainer.train(rollout_id, train_data)
        update_engine_weights(trainer, engine_url, rollout_id + 1, run_dir / "weights")

``generate`` does what slime's ``RolloutManager._get_rollout_data`` and converter do
(docs/slime.md §3.1, §3.2): call the rollout function as
``rollout_fn(args, rollout_id, data_source, evaluation=False)`` (slime's signature; default the
synchronous :func:`dressage.rollout.sync_rollout.generate_rollout`, or
``args.rollout_function_path``: the asynchronous drivers plug in here), check that the siblings
of every fan-out share their ``rollout_id``, flatten, and convert with
``args.custom_convert_samples_to_train_data_path`` (default dressage's prompt-equal converter).

:meth:`EmbeddedRolloutManager.rollout_state` is what a checkpoint keeps of the rollout side to
resume at a given rollout: the data source's position as it was before that rollout's prompts
were taken, and the prompts handed out earlier that no trained rollout holds (the data source's
buffer, the partial-async worker's groups); :meth:`~EmbeddedRolloutManager.load_rollout_state`
puts them back (``dressage.training.embedded.checkpoint`` says why these).

:func:`update_engine_weights` is the weight push of the embedded default: the trainer saves a
Hugging Face folder, the engine loads it with ``POST /update_weights_from_disk``.
"""

from __future__ import annotations

import copy
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from dressage.rollout.generate.blackbox_dispatch import AGENT_META
from dressage.rollout.multi_segment import multi_segment_metrics
from dressage.rollout.partial_async_rollout import held_groups
from dressage.slime.hooks import load_function
from dressage.slime.sample_meta import (
    DATASET,
    NO_GRAD_REASON,
    NUM_SEGMENTS,
    SEGMENT_INDEX,
    TEACHER_ID,
)
from dressage.slime.train_args import SLIME_DEFAULT_ROLLOUT_FUNCTION, actor_args
from dressage.training.metrics_sink import rollout_metrics
from dressage.types import RolloutFnTrainOutput, Sample

__all__ = [
    "DEFAULT_CONVERTER",
    "EmbeddedRolloutManager",
    "WeightUpdateError",
    "anchor_metrics",
    "flatten_rollout",
    "update_engine_weights",
]

DEFAULT_CONVERTER = "dressage.rollout.convert_samples.convert_samples_to_train_data"
SLIME_DEFAULT_ROLLOUT = SLIME_DEFAULT_ROLLOUT_FUNCTION

RolloutFn = Callable[..., Any]
ROLLOUT_STATE_VERSION = 1


def flatten_rollout(groups: Sequence[Any]) -> list[Sample]:
    """slime's check and flatten: a list of two or more samples nested two levels deep (a
    fan-out inside a group) must share one non-None ``rollout_id``.

    Raises:
        ValueError: siblings without or with different rollout ids; a leaf that is no Sample.
    """
    out: list[Sample] = []

    def walk(item: Any, depth: int) -> None:
        if isinstance(item, Sample):
            out.append(item)
            return
        if not isinstance(item, list | tuple):
            raise ValueError(f"rollout output holds a {type(item).__name__}, not a Sample")
        leaves = [x for x in item if isinstance(x, Sample)]
        if depth >= 2 and len(leaves) > 1:
            ids = {s.rollout_id for s in leaves}
            if None in ids or len(ids) != 1:
                indices = [s.index for s in leaves]
                raise ValueError(
                    f"siblings {indices} of one trajectory have rollout ids {sorted(ids, key=str)}"
                    "; a fan-out must share one rollout_id"
                )
        for x in item:
            walk(x, depth + 1)

    walk(list(groups), 0)
    return out


def _is_anchor(sample: Sample) -> bool:
    meta = sample.metadata
    return NUM_SEGMENTS not in meta or meta.get(SEGMENT_INDEX) == meta[NUM_SEGMENTS] - 1


def anchor_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Per trajectory (anchors): rewards per teacher and dataset, outcomes, agent effort."""
    anchors = [s for s in samples if _is_anchor(s)]
    out: dict[str, float] = {}
    rewards: dict[str, list[float]] = defaultdict(list)
    for anchor in anchors:
        meta = anchor.metadata
        if NO_GRAD_REASON in meta or not isinstance(anchor.reward, int | float):
            continue
        for kind, key in (("teacher", TEACHER_ID), ("dataset", DATASET)):
            if meta.get(key) is not None:
                rewards[f"rollout/reward/{kind}/{meta[key]}"].append(float(anchor.reward))
    for name, values in sorted(rewards.items()):
        out[name] = sum(values) / len(values)
    n = max(len(anchors), 1)
    statuses = [s.status for s in anchors]
    out["rollout/trajectories_no_grad"] = float(sum(NO_GRAD_REASON in s.metadata for s in anchors))
    out["rollout/trajectories_failed"] = float(statuses.count(Sample.Status.FAILED))
    out["rollout/trajectories_aborted"] = float(statuses.count(Sample.Status.ABORTED))
    out["rollout/trajectories_truncated"] = float(statuses.count(Sample.Status.TRUNCATED))
    agent = [
        s.metadata[AGENT_META] for s in anchors if isinstance(s.metadata.get(AGENT_META), dict)
    ]
    for key in ("turns", "tool_calls", "tool_errors", "compactions", "attempts"):
        values = [float(a[key]) for a in agent if isinstance(a.get(key), int | float)]
        if values:
            out[f"rollout/agent/{key}_mean"] = sum(values) / n
    return out


class EmbeddedRolloutManager:
    """slime's RolloutManager for one process: rollout function, checks, conversion, metrics.

    Args:
        args: slime-named options (``rollout_batch_size``, ``custom_*_path``, ...).
        data_source: a slime ``DataSource`` (e.g. ``MopdDataSource(args)``).
        rollout_fn: ``fn(args, rollout_id, data_source, evaluation=False)``; default
            ``args.rollout_function_path`` when set (and not slime's own default), else the
            synchronous batch rollout.
    """

    def __init__(self, args: Any, data_source: Any, *, rollout_fn: RolloutFn | None = None):
        self.args = args
        self.data_source = data_source
        self.rollout_fn = rollout_fn or self._default_rollout_fn()
        converter = actor_args(args).custom_convert_samples_to_train_data_path
        self.convert = load_function(converter or DEFAULT_CONVERTER)
        self._before: dict[int, dict[str, Any]] = {}  # rollout id -> the state before it
        self._lock = threading.Lock()

    def _default_rollout_fn(self) -> RolloutFn:
        path = actor_args(self.args).rollout_function_path
        if path and path != SLIME_DEFAULT_ROLLOUT:
            return load_function(path)
        from dressage.rollout.sync_rollout import generate_rollout

        return generate_rollout

    def generate(self, rollout_id: int) -> tuple[dict[str, Any], list[Sample], dict[str, float]]:
        """One rollout: ``(train_data, flat samples, metrics)``."""
        with self._lock:  # the state before this rollout takes any prompt
            self._before.setdefault(rollout_id, self._snapshot())
            for old in [r for r in self._before if r < rollout_id - 1]:
                del self._before[old]
        start = time.perf_counter()
        output = self.rollout_fn(self.args, rollout_id, self.data_source, evaluation=False)
        if isinstance(output, RolloutFnTrainOutput):
            groups, extra = output.samples, dict(output.metrics or {})
        else:  # slime accepts a bare list (legacy)
            groups, extra = output, {}
        samples = flatten_rollout(groups)
        if not samples:
            raise ValueError(f"rollout {rollout_id}: the rollout function returned no samples")
        generated = time.perf_counter() - start
        train_data = self.convert(self.args, samples)
        metrics: dict[str, float] = {
            k: float(v) for k, v in extra.items() if isinstance(v, int | float)
        }
        metrics.update({k: float(v) for k, v in rollout_metrics(samples, generated).items()})
        metrics.update(multi_segment_metrics(samples))
        metrics.update(anchor_metrics(samples))
        metrics["perf/rollout_time"] = time.perf_counter() - start
        return train_data, samples, metrics

    def eval(self, rollout_id: int) -> Any:
        """The rollout function with ``evaluation=True`` (a ``RolloutFnEvalOutput``)."""
        return self.rollout_fn(self.args, rollout_id, self.data_source, evaluation=True)

    def rollout_state(self, rollout_id: int) -> dict[str, Any] | None:
        """What resuming at ``rollout_id`` needs, as JSON: ``data_source`` (its
        ``state_dict()`` before ``rollout_id`` took prompts) and ``groups`` (prompt copies of the
        groups handed out before then that no earlier rollout returned: the data source's buffer,
        then the partial-async worker's). Call it after training ``rollout_id - 1``; None for a
        data source without ``state_dict``. The snapshot taken when ``generate(rollout_id)``
        began is used, else one taken now (that rollout has not started)."""
        if not hasattr(self.data_source, "state_dict"):
            return None
        with self._lock:
            return self._before.setdefault(rollout_id, self._snapshot())

    def load_rollout_state(self, state: dict[str, Any] | None) -> None:
        """Put a :meth:`rollout_state` back: the position, then the groups first in line."""
        if state is None:
            return
        if state.get("version") != ROLLOUT_STATE_VERSION:
            raise ValueError(
                f"rollout state version {state.get('version')!r}, expected {ROLLOUT_STATE_VERSION}"
            )
        if not hasattr(self.data_source, "load_state_dict"):
            raise ValueError(
                f"{type(self.data_source).__name__} has no load_state_dict: the data source's "
                "saved position cannot be restored"
            )
        self.data_source.load_state_dict(state["data_source"])
        groups = [[Sample.from_dict(s) for s in group] for group in state["groups"]]
        if groups:
            self.data_source.add_samples(groups)

    def _snapshot(self) -> dict[str, Any]:
        source = self.data_source
        if not hasattr(source, "state_dict"):
            return {}
        with held_groups(source) as held:  # the worker takes no prompt meanwhile
            position = copy.deepcopy(source.state_dict())
            groups = [*copy.deepcopy(list(getattr(source, "buffer", []))), *held]
        return {
            "version": ROLLOUT_STATE_VERSION,
            "data_source": position,
            "groups": [[s.to_dict() for s in group] for group in groups],
        }

    def save(self, rollout_id: int) -> None:
        self.data_source.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> None:
        self.data_source.load(rollout_id)


class WeightUpdateError(RuntimeError):
    """The engine did not take the new weights; the message names the engine and version."""


def update_engine_weights(
    trainer: Any,
    engine_url: str,
    version: int | str,
    out_dir: str | Path,
    *,
    api_key: str | None = None,
    keep: int = 2,
    timeout_s: float = 300.0,
) -> Path:
    """Save the trainer's student to ``out_dir/weights-v{version}`` and load it into the engine.

    ``POST {engine_url}/update_weights_from_disk {"model_path", "weight_version"}`` with
    ``api_key`` (the engine's control key, ``DRESSAGE_ENGINE_ADMIN_KEY``) as a bearer key; the
    engine stamps every later token with ``version`` (the proxy records it per token). Older
    ``weights-v*`` folders beyond the newest ``keep`` are removed once the engine has the new
    ones.

    Raises:
        WeightUpdateError: the engine is unreachable or refused the checkpoint.
    """
    folder = trainer.save_weights(Path(out_dir) / f"weights-v{version}")
    url = f"{engine_url.rstrip('/')}/update_weights_from_disk"
    body = {"model_path": str(folder), "weight_version": str(version)}
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    where = f"engine {engine_url}: weight version {version} from {folder}"
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise WeightUpdateError(f"{where}: {type(exc).__name__}: {exc}") from exc
    try:
        answer = response.json()
    except ValueError:
        answer = {"message": response.text[:500]}
    if response.status_code != 200 or not answer.get("success", False):
        hint = " (the engine's control key, DRESSAGE_ENGINE_ADMIN_KEY)" * (
            response.status_code == 401
        )
        raise WeightUpdateError(
            f"{where}: HTTP {response.status_code}: {answer.get('message', answer)}{hint}"
        )
    _prune(Path(out_dir), keep, keep_path=folder)
    return folder


def _prune(out_dir: Path, keep: int, *, keep_path: Path) -> None:
    def version_of(path: Path) -> tuple[int, str]:
        tail = path.name.removeprefix("weights-v")
        return (int(tail), "") if tail.isdigit() else (-1, tail)

    folders = sorted(out_dir.glob("weights-v*"), key=lambda p: (p.stat().st_mtime, version_of(p)))
    for old in folders[: max(len(folders) - max(keep, 1), 0)]:
        if old != keep_path:
            shutil.rmtree(old, ignore_errors=True)
