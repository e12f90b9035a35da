"""slime's Megatron actor with every MOPD teacher in host memory, rotated in to score its samples.

The driver (dressage.training.mopd_train) hands it to slime with
``create_training_models(args, pgs, rollout_manager, actor_cls=MopdMegatronActor)``. On top of
``MegatronTrainRayActor`` it only:

* ``init``: loads each teacher of the MOPD config into slime's ``TensorBackuper`` under the tag
  ``teacher:<id>`` (slime's ``load_other_checkpoint``, a pinned ``ckpt_step`` through
  ``args.ckpt_step``, so no extra ``"teacher"`` tag is left for slime to restore every step),
  then switches back to ``"actor"``. The load runs while the actor is awake: under
  ``--offload-train`` (the default with ``--colocate``) slime's ``init`` ends with
  ``self.sleep()``, and the actor loads its teachers at that call, just before it sleeps;
* ``compute_log_prob``: at the first log-prob pass slime runs for a rollout, it first groups the
  rank-local samples by teacher id (the ``prompt`` slot, filled by the MOPD converter), and for
  each teacher present switches to it and runs slime's ``compute_log_prob`` with
  ``store_prefix="teacher_"`` over that teacher's samples only, packed into micro-batches of
  their own the way slime packs a step (``first_fit_pack`` under ``--use-dynamic-batch-size``,
  ``--micro-batch-size`` chunks otherwise): K teachers cost one pass over the batch, not K.
  The scores land in ``rollout_data["teacher_log_probs"]`` in sample order, and the model slime
  had active comes back. The custom advantage hook (dressage.training.mopd_loss) reads them;
* ``_switch_model``: skips restoring the tag the weights are known to hold (slime's step
  restores ``"actor"`` right after the last step backed it up; known only after a restore or
  that backup, forgotten at ``sleep`` and at a checkpoint load), and under ``--mopd-restore
  streamed`` (the default; CUDA, one model chunk) streams the teachers and the student after
  them in layer by layer under their passes: slime's restore's copies, from its backups, on a
  side stream, each layer's forward waiting for its own
  (:class:`dressage.training.weight_streaming.LayerStreamer`). The actor waits for every copy
  once the pass after its last switch has run, before slime trains, backs up or sends weights;
* ``rollout_data_postprocess`` (slime calls it between the advantage hook and its train-side
  rollout logging): drops the ``prompt`` slot, whose teacher-id strings slime's logging would
  try to average, after running the user's own postprocess hook, if any.

With ``--mopd-objective topk`` (:mod:`dressage.training.mopd_topk`) each teacher's pass is slime's
own ``forward_only`` with :func:`dressage.training.topk_teacher_pass.log_probs_and_support` as
its post-forward function, over the same micro-batches: besides slime's sampled-token
log-probs it keeps the teacher's top-K support at every response position (``2K + 1`` values a
token, on the rank's vocabulary shard and context-parallel slice), hung on each sample's
``teacher_log_probs`` tensor, which carries it to the loss hook; the support's own keys never
enter ``rollout_data``. ``--mopd-objective dense`` (the teacher's full log-softmax at every
response token, ``V x 4`` bytes a token, :mod:`dressage.training.mopd_dense`) is refused, and so
is ``topk`` with ``--allgather-cp`` or ``--rollout-top-p`` below 1, at ``init``, before slime
builds anything (:func:`refuse_unsupported_objective`).

If slime ran no log-prob pass at all, the step fails (the advantage hook finds no teacher
log-probs). Under ``--use-routing-replay`` the teacher passes run with
``ROUTING_REPLAY_STAGE=fallthrough``, as slime runs its own reference and teacher passes.

Importing this module does not import slime (contract tests and the launcher import it). The
class subclasses slime's actor, so it is built on first access of ``MopdMegatronActor`` (PEP 562
module ``__getattr__``); Ray pickles it by module and name, and a worker rebuilds it the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dressage.slime.mopd_args import mopd_args
from dressage.slime.train_args import actor_args

__all__ = [
    "TEACHER_TAG_PREFIX",
    "combine_sums",
    "group_by_teacher",
    "log_teacher_metrics",
    "make_mopd_actor_cls",
    "refuse_unsupported_objective",
    "scatter_teacher_rows",
    "subset_rollout_data",
    "teacher_micro_batches",
    "teacher_tag",
]

TEACHER_TAG_PREFIX = "teacher:"
_REPLAY_STAGE = "ROUTING_REPLAY_STAGE"  # slime's routing-replay switch (an environment variable)
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


def scatter_teacher_rows(
    groups: Mapping[str, Sequence[int]], scored: Mapping[str, Sequence[T]], n: int
) -> list[T]:
    """Row ``i`` of the result is the score of sample ``i`` by the teacher that owns it.

    ``scored[t][j]`` is teacher ``t``'s output for its ``j``-th sample, ``groups[t][j]``.
    """
    out: list[T | None] = [None] * n
    for tid, positions in groups.items():
        rows = scored[tid]
        if len(rows) != len(positions):
            raise ValueError(
                f"teacher {tid!r} scored {len(rows)} samples, expected {len(positions)}"
            )
        for i, row in zip(positions, rows, strict=True):
            out[i] = row
    missing = [i for i, row in enumerate(out) if row is None]
    if missing:
        raise ValueError(f"local samples {missing[:5]} were scored by no teacher")
    return [row for row in out if row is not None]


def _load_teachers(actor: Any, args: Any) -> list[str]:
    """Back each teacher up under ``teacher:<id>`` (the last one loaded stays active); returns
    the ids.

    slime's ``load_other_checkpoint`` takes ``args.ckpt_step`` for any tag but its literal
    ``"ref"``/``"teacher"``, so a pinned step is set there for the one load and put back.
    """
    from dressage.config.mopd import load_mopd_config

    config = load_mopd_config(mopd_args(args).mopd_config)
    saved = actor_args(args).ckpt_step
    for tid, spec in sorted(config.teachers.items()):
        if spec.ckpt_step is not None:
            args.ckpt_step = spec.ckpt_step
        try:
            actor.load_other_checkpoint(teacher_tag(tid), spec.load)
        finally:
            args.ckpt_step = saved
    return sorted(config.teachers)


def teacher_micro_batches(
    args: Any, total_lengths: Sequence[int], *, vpp_size: int = 1, vpp_group: int = 1
) -> list[list[int]] | None:
    """Micro-batches (local indices) for one teacher's samples, packed as slime packs a step.

    ``--use-dynamic-batch-size``: slime's ``first_fit_pack`` under ``max_tokens_per_gpu x CP``;
    otherwise consecutive chunks of ``--micro-batch-size``. With virtual pipeline stages
    Megatron's interleaved schedule wants a multiple of ``microbatch_group_size_per_vp_stage``
    micro-batches: the bins are split to get one (slime's ``expand_bins_by_splitting``), and
    None says it cannot be done (too few samples), so the caller scores that teacher over the
    batch as slime scheduled it.
    """
    lengths = [int(n) for n in total_lengths]
    view = actor_args(args)
    if view.use_dynamic_batch_size:
        from slime.utils.seqlen_balancing import first_fit_pack

        if view.max_tokens_per_gpu is None:  # slime requires it with dynamic batches
            raise ValueError("--use-dynamic-batch-size needs --max-tokens-per-gpu")
        cp = view.context_parallel_size
        bins: list[list[int]] = first_fit_pack(lengths, view.max_tokens_per_gpu * cp)
    else:
        size = max(1, view.micro_batch_size or 1)
        bins = [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    if vpp_size > 1 and len(bins) % vpp_group:
        from slime.utils.seqlen_balancing import expand_bins_by_splitting

        target = -(-len(bins) // vpp_group) * vpp_group
        expand_bins_by_splitting(bins, target, lengths)
        if len(bins) != target:
            return None
    return bins


def subset_rollout_data(
    rollout_data: Mapping[str, Any], positions: Sequence[int]
) -> dict[str, Any]:
    """The per-sample entries of ``rollout_data`` at ``positions`` (in that order), as a rollout
    dict of its own (keys that are not per-sample lists are left out)."""
    n = len(rollout_data["tokens"])
    out: dict[str, Any] = {}
    for key, values in rollout_data.items():
        if isinstance(values, list | tuple) and len(values) == n:
            out[key] = [values[i] for i in positions]
    return out


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

    The advantage hook deferred them on this rank (``dressage.training.mopd_metrics``); every rank
    joins one ``all_gather_object`` over its data-parallel group with context parallelism (a
    collective: all ranks call this after each step; each rank of that group holds a distinct
    share of the step's tokens), and the first rank of the group on the last pipeline stage,
    tensor rank 0, writes ``rollout/mopd/...`` to ``<mopd_metrics_dir>/teachers.jsonl`` and to
    W&B when a run is active in the process. Returns what it logged (empty on the other ranks).
    """
    from dressage.training.megatron_path import data_parallel_group, megatron_active
    from dressage.training.mopd_metrics import deferred_sums, means_of

    local = deferred_sums()
    shards: list[Mapping[str, tuple[float, float]] | None] = [local]
    writer = True
    if megatron_active():
        import torch.distributed as dist

        group, writer = data_parallel_group()
        shards = [None] * dist.get_world_size(group=group)
        dist.all_gather_object(shards, local, group=group)
    if not writer:
        return {}
    metrics = {f"rollout/{k}": v for k, v in means_of(combine_sums(shards)).items()}
    if not metrics:
        return {}
    from pathlib import Path

    from dressage.training.metrics_sink import MetricsSink

    folder = Path(mopd_args(args).mopd_metrics_dir or ".")
    with MetricsSink(folder / "teachers.jsonl") as sink:
        sink.log(rollout_id, metrics)
    try:
        import wandb

        if getattr(wandb, "run", None) is not None:
            wandb.log(metrics)
    except ImportError:
        pass
    return metrics


def refuse_unsupported_objective(args: Any) -> None:
    """Fail unless ``--mopd-objective`` is one this actor trains (``sampled``, or ``topk`` with
    options it can follow), before slime builds anything."""
    from dressage.training.mopd_dense import mopd_objective
    from dressage.training.topk_teacher_pass import check_topk_options

    objective = mopd_objective(args)
    if objective == "dense":
        raise ValueError(
            "--mopd-objective dense is embedded-only (dressage.training.embedded): on this slime "
            "actor it would keep each teacher's full log-softmax at every response token, V x 4 "
            "bytes a token (600 KB for a 152k-token vocabulary); use --mopd-objective topk, "
            "which keeps the teacher's top-K tokens and a tail (2K + 1 values a token), or sampled"
        )
    if objective == "topk":
        check_topk_options(args)


def _then_drop_teacher_ids(user_hook: Callable[..., Any] | None) -> Callable[..., None]:
    """slime's ``rollout_data_postprocess`` slot: the user's hook, then the ``prompt`` slot out
    (slime's train-side rollout logging averages every key it does not know, and teacher ids
    are strings)."""

    def postprocess(args: Any, rollout_id: int, rollout_data: dict[str, Any]) -> None:
        if user_hook is not None:
            user_hook(args, rollout_id, rollout_data)
        rollout_data.pop("prompt", None)

    return postprocess


class _Backups(Mapping[str, Any]):
    """slime's ``TensorBackuper`` read as ``tag -> name -> pinned tensor`` (its ``get``)."""

    def __init__(self, backuper: Any) -> None:
        self._backuper = backuper

    def __getitem__(self, tag: str) -> Any:
        if tag not in self._backuper.backup_tags:
            raise KeyError(tag)
        return self._backuper.get(tag)

    def __iter__(self) -> Any:
        return iter(self._backuper.backup_tags)

    def __len__(self) -> int:
        return len(self._backuper.backup_tags)


@functools.cache
def make_mopd_actor_cls() -> type:
    """The actor class (imports slime; built once per process)."""
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    class MopdMegatronActor(MegatronTrainRayActor):
        _mopd_pending: dict[str, Any] | None = None
        """The rollout whose samples the next log-prob pass scores with their teachers."""
        _mopd_teachers: tuple[str, ...] = ()
        _mopd_load_due = False
        _mopd_scoring = False
        _mopd_holds: str | None = None
        """The tag whose backup the model's weights are known to equal (None: not known)."""
        _mopd_streamed: Any = None
        """The layer streamer of this actor's teacher switches (False where none runs)."""
        _mopd_hooks: contextlib.ExitStack
        _mopd_stream_switches = False
        """Set while a forward pass follows every switch: the teachers' and the one back."""

        def init(
            self, args: Any, role: str, with_ref: bool = False, with_opd_teacher: bool = False
        ) -> Any:
            refuse_unsupported_objective(args)
            actor = role == "actor" and not actor_args(args).debug_rollout_only
            self._mopd_load_due = actor  # done by sleep() when slime's init ends asleep
            start_rollout_id = super().init(
                args, role, with_ref=with_ref, with_opd_teacher=with_opd_teacher
            )
            if self._mopd_load_due:  # no offload: slime's init ended awake
                self._mopd_load_teachers()
            if actor:
                user_hook = getattr(self, "rollout_data_postprocess", None)
                self.rollout_data_postprocess = _then_drop_teacher_ids(user_hook)
                args.mopd_defer_rollout_metrics = True  # see log_teacher_metrics
            return start_rollout_id

        def sleep(self) -> None:
            if self._mopd_load_due:  # the last call of slime's init under --offload-train
                self._mopd_load_teachers()
            self._mopd_settle()
            self._mopd_holds = None  # the weights may not survive the offload
            super().sleep()

        def load_other_checkpoint(self, model_tag: str, path: str) -> Any:
            self._mopd_settle()
            self._mopd_holds = None  # the checkpoint is loaded onto the model's weights
            return super().load_other_checkpoint(model_tag, path)

        def _switch_model(self, target_tag: str) -> None:
            """slime's switch, except that it skips restoring the tag the weights already hold
            (slime's step restores ``"actor"`` right after the last step backed it up), and
            that the switches of the teacher scoring stream in under their passes."""
            self._mopd_settle()
            if target_tag == self._mopd_holds and target_tag in self.weights_backuper.backup_tags:
                self._active_model_tag = target_tag
                return
            self._mopd_holds = None
            streamed = self._mopd_stream_switches and self._mopd_streamer() is not None
            if not streamed:
                super()._switch_model(target_tag)
            elif target_tag not in self.weights_backuper.backup_tags:
                raise ValueError(f"Cannot switch to unknown model tag: {target_tag}")
            else:
                streamer = self._mopd_streamed
                streamer.transition_now(target_tag)  # queued after the work already queued
                self._mopd_hooks.enter_context(streamer.installed())
                self._active_model_tag = target_tag
            self._mopd_holds = target_tag

        def _mopd_streamer(self) -> Any:
            """The layer streamer of the teacher switches (None where slime's restore runs): the
            copies of slime's restore, from its backups onto the tensors its restore writes, in
            forward order, each layer's forward waiting for its own copy
            (:class:`dressage.training.weight_streaming.LayerStreamer`)."""
            if self._mopd_streamed is None:
                self._mopd_streamed = False
                copies = self._mopd_copies()
                if copies is not None:
                    from slime.backends.megatron_utils.actor import named_params_and_buffers

                    from dressage.training.weight_streaming import LayerStreamer

                    targets = named_params_and_buffers(
                        self.args, self.model, convert_to_global_name=True
                    )  # what slime's TensorBackuper restores, by the names it backs up under
                    try:
                        self._mopd_streamed = LayerStreamer(
                            self.model[0], dict(targets), _Backups(self.weights_backuper), copies
                        )
                    except ValueError:  # no list of layers to stream: slime's restore
                        return None
                    self._mopd_hooks = contextlib.ExitStack()
            return self._mopd_streamed or None

        def _mopd_copies(self) -> Any:
            """Where streamed copies run: a side CUDA stream under ``--mopd-restore streamed``
            for a CUDA model of one chunk; None (slime's restore) otherwise."""
            params = list(self.model[0].parameters())
            streamed = mopd_args(self.args).mopd_restore == "streamed"
            if not (streamed and len(self.model) == 1 and params and params[0].is_cuda):
                return None
            from dressage.training.weight_streaming import CudaCopies

            return CudaCopies(params[0].device)

        def _mopd_settle(self) -> None:
            """Order the compute stream after every streamed copy, and take the hooks off."""
            if self._mopd_streamed:
                self._mopd_streamed.finish()
                self._mopd_hooks.close()

        def _mopd_load_teachers(self) -> None:
            self._mopd_load_due = False
            self._mopd_teachers = tuple(_load_teachers(self, self.args))
            self._switch_model("actor")

        def train_actor(
            self, rollout_id: int, rollout_data: dict[str, Any], external_data: Any = None
        ) -> Any:
            self._mopd_pending = rollout_data
            try:
                result = super().train_actor(rollout_id, rollout_data, external_data)
                self._mopd_holds = "actor"  # slime's step ends backing the trained weights up
            finally:
                self._mopd_settle()
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
            try:
                if rollout_data is not None:
                    self._score_teachers(rollout_data, data_iterator, num_microbatches)
                if store_prefix == "teacher_" and not self._mopd_scoring:
                    # slime's single-teacher OPD pass (--use-opd megatron, refused at launch): it
                    # would overwrite the per-sample scores with one teacher's.
                    return {}
                return super().compute_log_prob(
                    data_iterator, num_microbatches, store_prefix=store_prefix
                )
            finally:  # the pass after the switch back has run: the weights are whole again
                self._mopd_settle()
                self._mopd_holds = None  # slime trains next, or switches

        def _score_teachers(
            self, rollout_data: dict[str, Any], data_iterator: Any, num_microbatches: Any
        ) -> None:
            groups = group_by_teacher(
                rollout_data.get("prompt"),
                known=self._mopd_teachers,
                rollout_ids=rollout_data.get("rollout_ids"),
                sample_indices=rollout_data.get("sample_indices"),
            )
            active = self._active_model_tag or "actor"
            stage = os.environ.get(_REPLAY_STAGE)
            scored: dict[str, list[Any]] = {}
            self._mopd_scoring = True
            self._mopd_stream_switches = True
            try:
                if actor_args(self.args).use_routing_replay:
                    os.environ[_REPLAY_STAGE] = "fallthrough"  # as slime's ref/teacher passes
                # sorted: every model-parallel rank of this DP rank holds the same samples and
                # must run the same passes in the same order.
                for tid in sorted(groups):
                    self._switch_model(teacher_tag(tid))
                    rows = self._teacher_pass(
                        rollout_data, groups[tid], data_iterator, num_microbatches
                    )
                    if rows is not None:  # only the last pipeline stage gets values
                        scored[tid] = rows
            finally:
                self._mopd_scoring = False
                try:  # the caller's pass comes next and waits on each of its layers' copies
                    self._switch_model(active)
                finally:
                    self._mopd_stream_switches = False
                if stage is None:
                    os.environ.pop(_REPLAY_STAGE, None)
                else:
                    os.environ[_REPLAY_STAGE] = stage
            if scored:
                n = len(rollout_data["tokens"])
                rollout_data["teacher_log_probs"] = scatter_teacher_rows(groups, scored, n)

        def _teacher_pass(
            self,
            rollout_data: dict[str, Any],
            positions: list[int],
            data_iterator: Any,
            num_microbatches: Any,
        ) -> list[Any] | None:
            """The active teacher's log-probs of the samples at ``positions``, in that order
            (None off the last pipeline stage)."""
            from slime.backends.megatron_utils.data import get_data_iterator

            n = len(rollout_data["tokens"])
            config = getattr(self, "train_parallel_config", {}) or {}
            bins = None
            sub: dict[str, Any] = {}
            if len(positions) < n:
                sub = subset_rollout_data(rollout_data, positions)
                bins = teacher_micro_batches(
                    self.args,
                    sub["total_lengths"],
                    vpp_size=int(config.get("vpp_size", 1) or 1),
                    vpp_group=int(config.get("microbatch_group_size_per_vp_stage", 1) or 1),
                )
            if bins is None:  # every sample is this teacher's, or no compact schedule fits
                values = self._mopd_teacher_forward(data_iterator, num_microbatches)
                return None if values is None else [values[i] for i in positions]
            sub["micro_batch_indices"] = bins
            values = self._mopd_teacher_forward(get_data_iterator(sub), [len(bins)])
            if values is None:
                return None
            if actor_args(self.args).use_dynamic_batch_size:
                return list(values)  # slime's forward_only puts them back in sample order
            ordered: list[Any] = [None] * len(positions)
            for value, i in zip(values, (i for b in bins for i in b), strict=True):
                ordered[i] = value
            return ordered

        def _mopd_teacher_forward(
            self, data_iterator: Any, num_microbatches: Any
        ) -> list[Any] | None:
            """The active teacher's ``teacher_log_probs`` over a schedule, in its sample order
            (None off the last pipeline stage); with ``topk`` each carries its support."""
            from dressage.training.mopd_dense import mopd_objective

            if mopd_objective(self.args) != "topk":
                out = super().compute_log_prob(
                    data_iterator, num_microbatches, store_prefix="teacher_"
                )
                values = out.get("teacher_log_probs")
                return None if values is None else list(values)
            from slime.backends.megatron_utils.model import forward_only
            from slime.observability.timer import timer

            from dressage.training.topk_teacher_pass import log_probs_and_support, with_supports

            with timer("teacher_log_probs"):  # as slime's compute_log_prob times its passes
                out = forward_only(
                    log_probs_and_support,
                    self.args,
                    self.model,
                    data_iterator,
                    num_microbatches,
                    store_prefix="teacher_",
                    use_rollout_top_p_replay=True,
                )
            return with_supports(out, "teacher_")

    MopdMegatronActor.__module__ = __name__
    MopdMegatronActor.__qualname__ = "MopdMegatronActor"
    return MopdMegatronActor


def __getattr__(name: str) -> Any:
    if name == "MopdMegatronActor":
        return make_mopd_actor_cls()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
