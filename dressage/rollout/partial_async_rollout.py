"""★ Partial-async rollout: agents keep running in the background across rollout calls.

    --rollout-function-path dressage.rollout.partial_async_rollout.generate_rollout_partial_async
    --custom-generate-function-path dressage.rollout.generate.blackbox_dispatch.generate

slime calls ``generate_rollout_partial_async(args, rollout_id, data_source, evaluation=False)``
(docs/slime.md §2). The first call starts a worker: a thread with its own asyncio loop (as
slime's fully-async rollout, §8.5) that keeps up to ``--dressage-async-groups-in-flight`` groups
(default ``2 x rollout_batch_size``) generating through ``group_generation.generate_group`` and
queues each finished group. Like slime's worker it never idles unless told to: when agents
outpace training the queue grows, and the staleness bound below is what keeps old groups out of
training, by dropping groups that were generated for nothing (in a GRPO run on 2 cores, 8-22
for every 8 trained, taking CPU from the trainer). ``--dressage-async-max-groups-ahead N``
bounds the groups ahead of training, generating or finished and not yet taken: at ``N`` the
worker waits until a call takes some. Each call
returns exactly ``rollout_batch_size`` finished groups, in the order they finished, blocking
until enough are done; the surplus (and everything still generating) carries over to the next
call. Weight updates do not stop the worker: the driver pauses the
proxy around them (``dressage.training.train_async_with_rollout_pause``), so in-flight agent
calls continue with the new weights and their tokens carry both versions.

``--dynamic-sampling-filter-path`` (slime's DAPO dynamic sampling, e.g.
:func:`dressage.rollout.filters.nonzero_reward_std`) is honoured after the staleness bound: a
group the filter rejects is left out and counted (``partial_async/filtered_groups``, and per
reason), and the call takes further groups until the batch is full; a filter that rejects
``MAX_FILTERED_IN_A_ROW`` batches' worth of groups in a row fails the call.

Every group is tagged with the weight version at its start (``metadata
["dressage_group_start_version"]``). Staleness bound ``--dressage-max-staleness K`` (unset: no
bound): a group whose oldest generated token is older than ``current_version - K`` is

- ``drop`` (default ``--dressage-stale-policy``): left out of the batch, and its prompt goes back
  to the data source as fresh copies (``data_source.add_samples``, slime's buffer semantics) so it
  is generated again with current weights (slime would keep the finished samples and not rerun
  them); or
- ``mask``: kept, with loss mask 0 on every trainable token older than the bound (per token from
  ``metadata["full_versions"]``; without token versions, the whole sample).

The current version is the proxy's (``GET /v1/rollout/pause_state`` at ``args.dressage_proxy_url``
or ``DRESSAGE_PROXY_URL``, with ``args.dressage_proxy_admin_key`` or ``DRESSAGE_PROXY_ADMIN_KEY``),
or ``args.dressage_version_source_path``'s (a dotted zero-argument function), and never older
than the newest token seen. A generate function that raises stops the worker; the next call
re-raises it (the black-box dispatch turns agent failures into no-grad samples itself, so this
is a broken configuration). Evaluation delegates to the plain synchronous batch rollout
(``dressage.rollout.sync_rollout``): nothing is carried over.

:func:`held_groups` shows, as fresh prompt copies, the groups the worker took from the data
source and no call has taken yet (generating or finished), with the worker kept from taking
more: what a checkpoint of the embedded trainer keeps so a resumed run skips no prompt
(``dressage.training.embedded.checkpoint``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dressage.config.proxy_access import ProxyAccessSettings
from dressage.rollout.filters import filter_verdict
from dressage.rollout.group_generation import (
    GroupResult,
    generate_group,
    leaves,
    sampling_params_from_args,
)
from dressage.slime.hooks import load_function
from dressage.slime.rollout_args import rollout_args
from dressage.slime.sample_meta import describe, record_written
from dressage.trajectory import NO_VERSION
from dressage.types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample

__all__ = [
    "FinishedGroup",
    "generate_rollout_partial_async",
    "held_groups",
    "oldest_version",
    "stop_partial_async_workers",
]

log = logging.getLogger(__name__)

START_VERSION = "dressage_group_start_version"
STALE_MASKED = "dressage_stale_masked_tokens"


@dataclass
class FinishedGroup:
    samples: GroupResult
    templates: list[Sample]
    """Fresh copies of the prompt as the data source gave it (to requeue a dropped group)."""
    start_version: int
    started_at: float
    finished_at: float
    key: int = -1
    """The worker's number for the group (its entry in ``_Worker.held`` until taken)."""


def _sample_versions(sample: Sample) -> list[int]:
    spans = sample.metadata.get("version_spans")
    if isinstance(spans, list) and spans:
        return [int(v) for v, _, _ in spans]
    return [int(v) for v in sample.weight_versions if str(v).lstrip("-").isdigit()]


def oldest_version(group: GroupResult) -> int | None:
    """The oldest weight version of any generated token of the group (None: no tokens)."""
    versions = [v for s in leaves(group) for v in _sample_versions(s) if v != NO_VERSION]
    return min(versions) if versions else None


def _newest_version(group: GroupResult) -> int | None:
    versions = [v for s in leaves(group) for v in _sample_versions(s) if v != NO_VERSION]
    return max(versions) if versions else None


def _mask_older_than(sample: Sample, bound: int) -> int:
    """Zero the loss mask of response tokens generated before version ``bound``."""
    mask = sample.loss_mask
    if not mask:
        return 0
    full = sample.metadata.get("full_versions")
    n = sample.response_length
    if isinstance(full, list) and len(full) == len(sample.tokens):
        versions = full[len(full) - n :]
    else:  # no token versions: the sample is as old as its oldest version
        oldest = min(_sample_versions(sample), default=bound)
        versions = [oldest] * n
    new = [
        0 if m and v != NO_VERSION and v < bound else m for m, v in zip(mask, versions, strict=True)
    ]
    masked = sum(mask) - sum(new)
    if masked:
        sample.loss_mask = new
        sample.metadata[STALE_MASKED] = sample.metadata.get(STALE_MASKED, 0) + masked
        record_written(sample, sum(new))
    return masked


def _version_source(args: Any) -> Callable[[], int | None]:
    view = rollout_args(args)
    path = view.dressage_version_source_path
    if path:
        fn: Callable[[], int | None] = load_function(path)
        return fn
    access = ProxyAccessSettings.from_args(args)
    if not access.proxy_url:
        return lambda: None
    from dressage.proxy.client import SyncProxyClient

    client = SyncProxyClient(access.proxy_url, admin_key=access.admin_key, timeout=30.0)

    def from_proxy() -> int | None:
        version = client.pause_state().get("weight_version")
        return None if version is None else int(version)

    return from_proxy


class _Worker:
    """The background generator of one data source (see the module docstring)."""

    def __init__(self, args: Any, data_source: Any) -> None:
        self.args = args
        self.data_source = data_source
        view = rollout_args(args)
        self.batch = view.rollout_batch_size
        self.limit = view.dressage_async_groups_in_flight or 2 * self.batch
        self.ahead = view.dressage_async_max_groups_ahead
        self.params = sampling_params_from_args(args)
        self.version_fn = _version_source(args)
        self.finished: queue.Queue[FinishedGroup] = queue.Queue()
        self.lock = threading.Lock()  # the data source is read by the worker and requeued to
        self.held: dict[int, list[Sample]] = {}
        """Prompt copies of the groups taken from the data source and not yet by a call."""
        self._keys = itertools.count()
        self.error: BaseException | None = None
        self.in_flight = 0
        self.started = 0
        self.newest_seen = 0
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name="dressage-partial-async-rollout", daemon=True
        )
        self._thread.start()

    # -- the worker thread -------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    def _room(self, generating: int) -> bool:
        """Below ``--dressage-async-max-groups-ahead`` (generating plus finished, not taken)."""
        return self.ahead is None or generating + self.finished.qsize() < self.ahead

    def current_version(self) -> int:
        try:
            version = self.version_fn()
        except Exception as exc:  # a status read: the newest token seen still bounds it
            log.warning("partial-async rollout: cannot read the weight version: %r", exc)
            version = None
        return max(self.newest_seen, version if version is not None else 0)

    async def _one(self, key: int, group: list[Sample]) -> FinishedGroup:
        started = time.time()
        start_version = await asyncio.to_thread(self.current_version)
        templates = self.held[key]
        for sample in group:
            sample.metadata[START_VERSION] = start_version
        samples = await generate_group(self.args, group, self.params)
        for sample in leaves(samples):
            sample.metadata.setdefault(START_VERSION, start_version)
        return FinishedGroup(samples, templates, start_version, started, time.time(), key)

    async def _main(self) -> None:
        tasks: set[asyncio.Task[FinishedGroup]] = set()
        try:
            while not self._stop.is_set() and self.error is None:
                while len(tasks) < self.limit and self._room(len(tasks)):
                    with self.lock:
                        (group,) = self.data_source.get_samples(1)
                        key = next(self._keys)
                        self.held[key] = copy.deepcopy(group)
                    tasks.add(asyncio.create_task(self._one(key, group)))
                    self.started += 1
                self.in_flight = len(tasks)
                if not tasks:
                    await asyncio.sleep(0.05)
                    continue
                done, tasks = await asyncio.wait(
                    tasks, timeout=0.2, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    exc = task.exception()
                    if exc is not None:
                        self.error = exc
                        break
                    finished = task.result()
                    newest = _newest_version(finished.samples)
                    if newest is not None:
                        self.newest_seen = max(self.newest_seen, newest)
                    self.finished.put(finished)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.in_flight = 0

    # -- the caller's side -------------------------------------------------------------------
    def take(self) -> FinishedGroup:
        while True:
            if self.error is not None:
                raise RuntimeError(
                    f"partial-async rollout: a group failed in the background: {self.error!r}"
                ) from self.error
            if not self._thread.is_alive():
                raise RuntimeError("partial-async rollout: the worker thread has stopped")
            try:
                group = self.finished.get(timeout=0.1)
            except queue.Empty:
                continue
            with self.lock:
                self.held.pop(group.key, None)
            return group

    def requeue(self, templates: list[Sample]) -> None:
        with self.lock:
            self.data_source.add_samples([templates])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


_WORKERS: dict[int, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def _worker(args: Any, data_source: Any) -> _Worker:
    with _WORKERS_LOCK:
        worker = _WORKERS.get(id(data_source))
        if worker is None or worker.data_source is not data_source:
            worker = _WORKERS[id(data_source)] = _Worker(args, data_source)
        return worker


@contextlib.contextmanager
def held_groups(data_source: Any) -> Iterator[list[list[Sample]]]:
    """Prompt copies of the groups the worker of ``data_source`` took from it that no call has
    taken yet (generating or finished), oldest first; [] without a worker. While the block runs
    the worker takes nothing from the data source, so its state and these groups agree."""
    with _WORKERS_LOCK:
        worker = _WORKERS.get(id(data_source))
    if worker is None or worker.data_source is not data_source:
        yield []
        return
    with worker.lock:
        yield [copy.deepcopy(group) for _, group in sorted(worker.held.items())]


def stop_partial_async_workers() -> None:
    """Stop every background worker (their in-flight agents are cancelled)."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values())
        _WORKERS.clear()
    for worker in workers:
        worker.stop()


def _staleness(
    worker: _Worker, group: FinishedGroup, current: int, metrics: dict[str, float]
) -> bool:
    """Apply the staleness bound to one group; False when it is dropped."""
    oldest = oldest_version(group.samples)
    age = current - (oldest if oldest is not None else group.start_version)
    metrics["staleness_max"] = max(metrics.get("staleness_max", 0.0), float(age))
    metrics["staleness_sum"] = metrics.get("staleness_sum", 0.0) + age
    view = rollout_args(worker.args)
    bound = view.dressage_max_staleness
    if bound is None or age <= bound:
        return True
    policy = view.dressage_stale_policy
    if policy == "drop":
        worker.requeue(group.templates)
        metrics["dropped_stale_groups"] = metrics.get("dropped_stale_groups", 0.0) + 1
        log.info("dropped a group %d versions old (bound %s); its prompt is requeued", age, bound)
        return False
    if policy != "mask":
        raise ValueError(f"--dressage-stale-policy must be drop or mask, got {policy!r}")
    oldest_allowed = current - int(bound)
    masked = sum(_mask_older_than(s, oldest_allowed) for s in leaves(group.samples))
    metrics["masked_stale_tokens"] = metrics.get("masked_stale_tokens", 0.0) + masked
    return True


MAX_FILTERED_IN_A_ROW = 20
"""Groups a dynamic sampling filter may reject in a row, in rollout batches, before the call
fails instead of waiting forever."""
KeepGroup = Callable[["_Worker", FinishedGroup, int, dict[str, float]], bool]


def _dynamic_filter(args: Any) -> KeepGroup:
    """slime's ``--dynamic-sampling-filter-path`` as a keep/drop decision per finished group
    (dropped groups are counted per reason; nothing is requeued, as in slime)."""
    path = rollout_args(args).dynamic_sampling_filter_path
    if not path:
        return lambda worker, group, kept, metrics: True
    fn = load_function(path)

    def keep(worker: _Worker, group: FinishedGroup, kept: int, metrics: dict[str, float]) -> bool:
        # the worker refills, so the batch runs short only when kept + finished + generating
        # cannot fill it
        short = kept + worker.finished.qsize() + worker.in_flight < worker.batch
        return filter_verdict(fn, args, group.samples, short=short, metrics=metrics)

    return keep


def generate_rollout_partial_async(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """slime's rollout function (see the module docstring)."""
    if evaluation:
        from dressage.rollout.sync_rollout import generate_rollout

        out: RolloutFnEvalOutput = generate_rollout(args, rollout_id, data_source, evaluation=True)
        return out
    worker = _worker(args, data_source)
    started = time.monotonic()
    current = worker.current_version()
    metrics: dict[str, float] = {}
    kept: list[FinishedGroup] = []
    keep = _dynamic_filter(args)
    rejected_in_a_row = 0
    while len(kept) < worker.batch:
        group = worker.take()
        if not _staleness(worker, group, current, metrics):
            continue
        if keep(worker, group, len(kept), metrics):
            kept.append(group)
            rejected_in_a_row = 0
            continue
        rejected_in_a_row += 1
        if rejected_in_a_row >= MAX_FILTERED_IN_A_ROW * worker.batch:
            raise RuntimeError(
                f"partial-async rollout: --dynamic-sampling-filter-path "
                f"{rollout_args(args).dynamic_sampling_filter_path} rejected {rejected_in_a_row} "
                "groups in a row, so no batch can be formed (does every group get the same reward?)"
            )
    partial = sum(
        bool(s.metadata.get("dressage_partial_rollout")) for g in kept for s in leaves(g.samples)
    )
    out = {
        "partial_async/wait_s": time.monotonic() - started,
        "partial_async/current_version": float(current),
        "partial_async/carried_over_groups": float(worker.finished.qsize()),
        "partial_async/in_flight_groups": float(worker.in_flight),
        "partial_async/groups_started": float(worker.started),
        "partial_async/dropped_stale_groups": metrics.get("dropped_stale_groups", 0.0),
        "partial_async/masked_stale_tokens": metrics.get("masked_stale_tokens", 0.0),
        "partial_async/staleness_max": metrics.get("staleness_max", 0.0),
        "partial_async/staleness_mean": metrics.get("staleness_sum", 0.0) / len(kept),
        "partial_async/partial_rollout_samples": float(partial),
        "partial_async/filtered_groups": metrics.get("filtered_groups", 0.0),
    }
    out |= {f"partial_async/{k}": v for k, v in metrics.items() if k.startswith("filtered/")}
    for group in kept:
        _check_siblings(group.samples)
    return RolloutFnTrainOutput(samples=[g.samples for g in kept], metrics=out)


def _check_siblings(group: GroupResult) -> None:
    """slime's check (§3.1): siblings of one fan-out share one non-None rollout_id."""
    for item in group:
        if isinstance(item, list) and len(item) > 1:
            ids = {s.rollout_id for s in item}
            if None in ids or len(ids) != 1:
                raise ValueError(
                    f"{describe(item[0])}: siblings of one trajectory must share a rollout_id, "
                    f"got {sorted(map(str, ids))}"
                )
