"""slime's Megatron actor with every MOPD teacher in host memory, rotated in to score its samples.

The driver (dressage.training.mopd_train) hands it to slime with
``create_training_models(args, pgs, rollout_manager, actor_cls=MopdMegatronActor)``. On top of
``MegatronTrainRayActor`` it only:

* ``init``: loads each teacher of the MOPD config into slime's ``TensorBackuper`` under the tag
  ``teacher:<id>`` (slime's ``load_other_checkpoint``), then switches back to ``"actor"``;
* ``train_actor``/``compute_log_prob``: at the first log-prob pass slime runs for a rollout, it
  first groups the rank-local samples by teacher id (the ``prompt`` slot, filled by the MOPD
  converter), switches to each teacher present, runs slime's ``compute_log_prob`` with
  ``store_prefix="teacher_"`` and keeps that teacher's rows, writes
  ``rollout_data["teacher_log_probs"]`` in sample order, and switches back to the model slime
  had active. The custom advantage hook (dressage.training.mopd_loss) reads it. A
  ``store_prefix="teacher_"`` pass that slime itself asks for (its single-teacher OPD) yields
  nothing, so it cannot overwrite the per-sample scores. If slime ran no log-prob pass at all,
  the step fails (the advantage hook finds no teacher log-probs).

Each teacher pass runs over the rank's whole batch with slime's own micro-batches: building
compact per-teacher micro-batches needs slime's data-iterator internals, which its documented
plug-in surface (reference/slime.md §6.3) does not include.

Importing this module does not import slime (contract tests and the launcher import it). The
class subclasses slime's actor, so it is built on first access of ``MopdMegatronActor`` (PEP 562
module ``__getattr__``); Ray pickles it by module and name, and a worker rebuilds it the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "TEACHER_TAG_PREFIX",
    "combine_sums",
    "group_by_teacher",
    "log_teacher_metrics",
    "make_mopd_actor_cls",
    "select_teacher_rows",
    "teacher_tag",
]

TEACHER_TAG_PREFIX = "teacher:"
T = TypeVar("T")


def teacher_tag(teacher_id: str) -> str:
    """The TensorBackuper tag of a teacher (slime's own tags: actor, ref, teacher, old_actor)."""
    return TEACHER_TAG_PREFIX + teacher_id


def _sample_name(i: int, sample_indices: Sequence[Any] | None) -> str:
    if sample_indices is not None and i < len(sample_indices):
        return f"sample index {sample_indices[i]} (local position {i})"
    return f"local sample {i}"


def group_by_teacher(
    teacher_ids: Sequence[Any] | None,
    *,
    known: Sequence[str],
    rollout_ids: Sequence[Any] | None = None,
    sample_indices: Sequence[Any] | None = None,
) -> dict[str, list[int]]:
    """Local positions per teacher id, in first-seen order; fails naming the sample.

    Every sample must name a teacher in ``known`` (no default teacher), and siblings (samples of
    one ``rollout_id``) must name the same one: they are one trajectory, one dataset row.
    """
    if teacher_ids is None:
        raise ValueError(
            "rollout_data has no 'prompt' teacher ids: the MOPD converter "
            "(dressage.rollout.convert_samples) must carry each sample's teacher_id there"
        )
    groups: dict[str, list[int]] = {}
    by_rollout: dict[Any, tuple[str, int]] = {}
    for i, raw in enumerate(teacher_ids):
        tid = raw if isinstance(raw, str) else None
        if not tid:
            raise ValueError(f"{_sample_name(i, sample_indices)}: no teacher_id (got {raw!r})")
        if tid not in known:
            raise ValueError(
                f"{_sample_name(i, sample_indices)}: teacher_id {tid!r} is not a loaded teacher "
                f"(loaded: {', '.join(sorted(known))})"
            )
        if rollout_ids is not None:
            first = by_rollout.setdefault(rollout_ids[i], (tid, i))
            if first[0] != tid:
                raise ValueError(
                    f"rollout_id {rollout_ids[i]}: siblings disagree on the teacher: "
                    f"{_sample_name(first[1], sample_indices)} names {first[0]!r}, "
                    f"{_sample_name(i, sample_indices)} names {tid!r}"
                )
        groups.setdefault(tid, []).append(i)
    return groups


def select_teacher_rows(
    groups: Mapping[str, Sequence[int]], scored: Mapping[str, Sequence[T]], n: int
) -> list[T]:
    """Row ``i`` of the result is row ``i`` of the output of the teacher that owns sample ``i``.

    ``scored[t]`` is teacher ``t``'s output for all ``n`` local samples, in sample order.
    """
    out: list[T | None] = [None] * n
    for tid, positions in groups.items():
        rows = scored[tid]
        if len(rows) != n:
            raise ValueError(f"teacher {tid!r} scored {len(rows)} samples, expected {n}")
        for i in positions:
            out[i] = rows[i]
    missing = [i for i, row in enumerate(out) if row is None]
    if missing:
        raise ValueError(f"local samples {missing[:5]} were scored by no teacher")
    return [row for row in out if row is not None]


def _load_teachers(actor: Any, args: Any) -> list[str]:
    """Back each teacher up under ``teacher:<id>``; returns the ids."""
    from dressage.config.mopd import load_mopd_config

    config = load_mopd_config(getattr(args, "mopd_config", None))
    for tid, spec in sorted(config.teachers.items()):
        if spec.ckpt_step is None:
            actor.load_other_checkpoint(teacher_tag(tid), spec.load)
            continue
        # slime takes a ckpt_step only for its literal tags ("teacher" reads
        # opd_teacher_ckpt_step), so a pinned step goes through that tag and is copied out;
        # the "teacher" slot then holds one extra host copy.
        saved = getattr(args, "opd_teacher_ckpt_step", None)
        args.opd_teacher_ckpt_step = spec.ckpt_step
        try:
            actor.load_other_checkpoint("teacher", spec.load)
        finally:
            args.opd_teacher_ckpt_step = saved
        actor.weights_backuper.backup(teacher_tag(tid))
    return sorted(config.teachers)


def combine_sums(
    shards: Sequence[Mapping[str, tuple[float, float]] | None],
) -> dict[str, tuple[float, float]]:
    """Add up per-rank (numerator, denominator) pairs key by key."""
    out: dict[str, tuple[float, float]] = {}
    for shard in shards:
        for key, (num, den) in (shard or {}).items():
            old_num, old_den = out.get(key, (0.0, 0.0))
            out[key] = (old_num + float(num), old_den + float(den))
    return out


def log_teacher_metrics(args: Any, rollout_id: int) -> dict[str, float]:
    """Per-teacher MOPD statistics of a step, exact over the data-parallel group.

    The advantage hook deferred them on this rank (``dressage.training.log_helpers``); every rank
    joins one ``all_gather_object`` over its data-parallel group (a collective: all ranks call
    this after each step), and the first rank of the group on the last pipeline stage, tensor
    rank 0, writes ``rollout/mopd/...`` to ``<mopd_metrics_dir>/teachers.jsonl`` and to W&B when
    a run is active in the process. Returns what it logged (empty on the other ranks).
    """
    from dressage.training.log_helpers import deferred_sums, means_of

    local = deferred_sums()
    shards: list[Mapping[str, tuple[float, float]] | None] = [local]
    writer = True
    try:
        import torch.distributed as dist
        from megatron.core import mpu
    except ImportError:  # no Megatron: a single process
        dist = None  # type: ignore[assignment]
    if dist is not None and dist.is_initialized():
        group = mpu.get_data_parallel_group()
        shards = [None] * dist.get_world_size(group=group)
        dist.all_gather_object(shards, local, group=group)
        writer = (
            mpu.get_data_parallel_rank() == 0
            and mpu.get_tensor_model_parallel_rank() == 0
            and mpu.is_pipeline_last_stage()
        )
    if not writer:
        return {}
    metrics = {f"rollout/{k}": v for k, v in means_of(combine_sums(shards)).items()}
    if not metrics:
        return {}
    from pathlib import Path

    from dressage.training.metrics import MetricsSink

    folder = Path(getattr(args, "mopd_metrics_dir", None) or ".")
    with MetricsSink(folder / "teachers.jsonl") as sink:
        sink.log(rollout_id, metrics)
    try:
        import wandb

        if getattr(wandb, "run", None) is not None:
            wandb.log(metrics)
    except ImportError:
        pass
    return metrics


@functools.cache
def make_mopd_actor_cls() -> type:
    """The actor class (imports slime; built once per process)."""
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    class MopdMegatronActor(MegatronTrainRayActor):
        _mopd_pending: dict[str, Any] | None = None
        _mopd_teachers: tuple[str, ...] = ()
        _mopd_scoring = False
        _mopd_active_tag = "actor"

        def init(
            self, args: Any, role: str, with_ref: bool = False, with_opd_teacher: bool = False
        ) -> Any:
            start_rollout_id = super().init(
                args, role, with_ref=with_ref, with_opd_teacher=with_opd_teacher
            )
            if role == "actor":
                self._mopd_teachers = tuple(_load_teachers(self, args))
                self._switch_model("actor")
                args.mopd_defer_rollout_metrics = True  # see log_teacher_metrics
            return start_rollout_id

        def _switch_model(self, tag: str) -> None:
            super()._switch_model(tag)
            self._mopd_active_tag = tag

        def train_actor(
            self, rollout_id: int, rollout_data: dict[str, Any], external_data: Any = None
        ) -> Any:
            self._mopd_pending = rollout_data
            try:
                result = super().train_actor(rollout_id, rollout_data, external_data)
            finally:
                unscored, self._mopd_pending = self._mopd_pending, None
            if unscored is not None:
                raise RuntimeError(
                    f"rollout {rollout_id}: slime ran no log-prob pass, so no teacher scored "
                    "this batch; MOPD needs the actor's log-prob forward"
                )
            log_teacher_metrics(self.args, rollout_id)
            return result

        def compute_log_prob(
            self, data_iterator: Any, num_microbatches: Any, store_prefix: str = ""
        ) -> Any:
            rollout_data, self._mopd_pending = self._mopd_pending, None
            if rollout_data is not None:
                self._score_teachers(rollout_data, data_iterator, num_microbatches)
            if store_prefix == "teacher_" and not self._mopd_scoring:
                # slime's single-teacher OPD pass (a "teacher" tag exists once a teacher pinned
                # a ckpt_step): it would overwrite the per-sample scores with one teacher's.
                return {}
            return super().compute_log_prob(
                data_iterator, num_microbatches, store_prefix=store_prefix
            )

        def _score_teachers(
            self, rollout_data: dict[str, Any], data_iterator: Any, num_microbatches: Any
        ) -> None:
            groups = group_by_teacher(
                rollout_data.get("prompt"),
                known=self._mopd_teachers,
                rollout_ids=rollout_data.get("rollout_ids"),
                sample_indices=rollout_data.get("sample_indices"),
            )
            active = getattr(self, "_mopd_active_tag", "actor")
            scored: dict[str, Any] = {}
            self._mopd_scoring = True
            try:
                # sorted: every model-parallel rank of this DP rank holds the same samples and
                # must run the same passes in the same order.
                for tid in sorted(groups):
                    self._switch_model(teacher_tag(tid))
                    out = super().compute_log_prob(
                        data_iterator, num_microbatches, store_prefix="teacher_"
                    )
                    if "teacher_log_probs" in out:  # only the last pipeline stage gets values
                        scored[tid] = out["teacher_log_probs"]
            finally:
                self._mopd_scoring = False
                self._switch_model(active)
            if scored:
                n = len(rollout_data["prompt"])
                rollout_data["teacher_log_probs"] = select_teacher_rows(groups, scored, n)

    MopdMegatronActor.__module__ = __name__
    MopdMegatronActor.__qualname__ = "MopdMegatronActor"
    return MopdMegatronActor


def __getattr__(name: str) -> Any:
    if name == "MopdMegatronActor":
        return make_mopd_actor_cls()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
