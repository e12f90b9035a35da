"""The embedded port of the async driver: one process, rollouts on a thread, training here.

    backend = EmbeddedAsyncBackend(trainer, rollout_manager, engine_url=ENGINE,
                                   weights_dir=OUT / "weights")
    train_async(args, backend, RolloutPause.from_env(proxy_url=PROXY))
    # dressage.training.train_async_with_rollout_pause.train_async

``generate`` hands ``rollout_manager.generate(rollout_id)`` (an ``EmbeddedRolloutManager``, or
anything returning ``(train_data, samples, metrics)``) to a one-thread pool, so rollout ``N + 1``
runs while the :class:`~dressage.training.embedded.EmbeddedTrainer` trains on rollout ``N`` in
the caller's thread (torch releases the GIL in its kernels; the engine and the proxy are other
processes or threads). ``update_weights`` writes the trainer's weights and has the engine load
them with ``/update_weights_from_disk`` under the next integer version, with
``engine_admin_key`` (the driver pauses the proxy around it). ``timeline`` records when each
rollout was generated and trained, and each update, so the overlap can be seen (and is tested).

The trainer lives in this process for the whole run, so ``releases_train`` is False: the loop
refuses slime's ``--release-train`` before anything runs. ``save`` writes a checkpoint under the
trainer's ``args.save`` (nothing without it): the trainer, and the rollout manager's state for
the rollout after the saved one (:mod:`dressage.training.embedded.checkpoint`); it writes
synchronously, so its ``force_sync`` changes nothing. ``num_rollout_per_epoch`` (None: no epoch
boundaries) places saves and evals at epoch ends as slime's rollout manager would. ``evaluate``
runs ``evaluator`` (the engine then serves the weights of the step just trained) and hands its
metrics to ``on_evaluated``; without one it logs that the pass was skipped.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from dressage.slime.train_args import actor_args

__all__ = ["EmbeddedAsyncBackend", "RolloutBatch", "TimelineEvent"]

log = logging.getLogger(__name__)

UpdateFn = Callable[[Any, str, int, Path], Any]
"""``(trainer, engine_url, version, out_dir)``: push the trainer's weights as ``version``."""


@dataclass
class RolloutBatch:
    """One rollout as the manager produced it, with when it ran."""

    rollout_id: int
    train_data: dict[str, Any]
    samples: list[Any]
    metrics: dict[str, Any]
    started: float
    finished: float


@dataclass(frozen=True)
class TimelineEvent:
    kind: str
    """``generate``, ``train``, ``update`` or ``eval``."""
    rollout_id: int
    start: float
    end: float


@dataclass
class EmbeddedAsyncBackend:
    """See the module docstring. ``on_trained(batch, train_metrics)`` runs after each step."""

    releases_train: ClassVar[bool] = False
    trainer: Any
    rollout_manager: Any
    engine_url: str
    weights_dir: Path
    update_engine_weights: UpdateFn | None = None
    engine_admin_key: str | None = None
    """The engine's control key, sent with the default weight update."""
    on_trained: Callable[[RolloutBatch, dict[str, float]], None] | None = None
    evaluator: Callable[[], dict[str, float]] | None = None
    """The eval pass at ``--eval-interval`` (after that step's weight update), e.g.
    :meth:`~dressage.training.embedded.evaluation.HeldOutAccuracy.measure`."""
    on_evaluated: Callable[[int, dict[str, float]], None] | None = None
    version: int = -1
    """The engine's weight version (read from ``/model_info`` when -1)."""
    num_rollout_per_epoch: int | None = None
    """Rollouts per pass over the data source, for epoch-end saves and evals (None: none)."""
    timeline: list[TimelineEvent] = field(default_factory=list)
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="dressage-rollout")
    )

    def __post_init__(self) -> None:
        if self.version < 0:
            info = httpx.get(f"{self.engine_url.rstrip('/')}/model_info", timeout=30).json()
            text = str(info.get("weight_version", "0"))
            self.version = int(text) if text.isdigit() else 0

    # -- the AsyncTrainBackend protocol ----------------------------------------------------------
    def generate(self, rollout_id: int) -> Future[RolloutBatch]:
        return self._pool.submit(self._generate, rollout_id)

    def _generate(self, rollout_id: int) -> RolloutBatch:
        started = time.monotonic()
        train_data, samples, metrics = self.rollout_manager.generate(rollout_id)
        finished = time.monotonic()
        self.timeline.append(TimelineEvent("generate", rollout_id, started, finished))
        return RolloutBatch(rollout_id, train_data, samples, dict(metrics), started, finished)

    def wait(self, handle: Future[RolloutBatch]) -> RolloutBatch:
        return handle.result()

    def create(self) -> None:
        # the loop asks only when releases_train is True: reaching here is a loop bug
        raise RuntimeError("--release-train: the embedded trainer is never released")

    def train(self, rollout_id: int, rollout_data: RolloutBatch) -> None:
        started = time.monotonic()
        metrics = self.trainer.train(rollout_id, rollout_data.train_data)
        self.timeline.append(TimelineEvent("train", rollout_id, started, time.monotonic()))
        if self.on_trained is not None:
            self.on_trained(rollout_data, metrics)

    def save(self, rollout_id: int, *, force_sync: bool = False) -> None:
        root = actor_args(self.trainer.args).save
        if not root:
            return
        from dressage.training.embedded.checkpoint import save_checkpoint

        state = getattr(self.rollout_manager, "rollout_state", None)
        folder = save_checkpoint(
            root, rollout_id, self.trainer, state(rollout_id + 1) if state is not None else None
        )
        log.info("rollout %d: checkpoint %s", rollout_id, folder)

    def update_weights(self) -> int:
        update = self.update_engine_weights
        if update is None:
            from dressage.training.embedded.rollout import update_engine_weights

            update = functools.partial(update_engine_weights, api_key=self.engine_admin_key)
        version = self.version + 1
        started = time.monotonic()
        update(self.trainer, self.engine_url, version, self.weights_dir)
        self.timeline.append(TimelineEvent("update", version, started, time.monotonic()))
        self.version = version
        return version

    def evaluate(self, rollout_id: int) -> None:
        if self.evaluator is None:
            log.info("rollout %d: no evaluator was given; eval skipped", rollout_id)
            return
        started = time.monotonic()
        metrics = self.evaluator()
        self.timeline.append(TimelineEvent("eval", rollout_id, started, time.monotonic()))
        if self.on_evaluated is not None:
            self.on_evaluated(rollout_id, metrics)

    def dispose(self) -> None:
        from dressage.rollout.partial_async_rollout import stop_partial_async_workers

        self._pool.shutdown(wait=True)
        stop_partial_async_workers()
