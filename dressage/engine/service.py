"""The asyncio side of the engine: the request gate, in-flight tracking, pause and weight updates.

HTTP handlers (``server.py``) call this; this calls the scheduler thread (``scheduler.py``).

- The *gate* holds new ``/generate`` requests (after validation, before the scheduler sees them)
  while the engine is paused or a weight update drains; they wait, they are not refused.
- ``pause(mode="abort")`` closes the gate, then aborts everything in flight, repeating every
  second until no request is left (SGLang's loop), and only then returns.
- ``update_weights`` reads and checks the checkpoint first (off the engine thread, old weights
  keep serving), then applies it at a token boundary: immediately when paused, otherwise after the
  gate is closed and in-flight requests have finished (SGLang's reader/writer lock). A second
  update while one is running is refused with 409, not queued. A checkpoint that cannot be loaded
  gets one message whatever the reason (:data:`UNUSABLE_CHECKPOINT`); the reason is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import torch

from dressage.engine.config import EngineConfig, default_num_threads
from dressage.engine.grammar import Grammars
from dressage.engine.model_runner import ModelRunner, WeightLoadError
from dressage.engine.protocol import EngineLimits
from dressage.engine.request import Request
from dressage.engine.sampling import SamplingParams
from dressage.engine.scheduler import Scheduler, SchedulerLimits

log = logging.getLogger(__name__)

_ABORT_RETRY_SEC = 1.0
_HEALTH_TIMEOUT_SEC = 20.0


UNUSABLE_CHECKPOINT = (
    "model_path is not a checkpoint this engine can load in place of its running model "
    "(the engine's log says why)"
)
"""The one answer to a checkpoint that cannot be loaded, whatever the reason."""


class WeightUpdateError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _kv_budget(config: EngineConfig, runner: ModelRunner) -> int:
    if config.max_total_tokens is not None:
        return config.max_total_tokens
    per_token = runner.cache.bytes_per_token
    if runner.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(runner.device)
        budget = int(free * 0.4)
    else:
        budget = 2 * 1024**3
    return max(runner.context_length, budget // per_token)


class EngineService:
    """Loads the model, owns the scheduler thread and the asyncio-side state."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        workers = config.num_threads or default_num_threads()
        # On CPU the engine's parallelism is the sharded lm_head pass (sampling.py); intra-op
        # threads would fight those workers for the same cores, so torch runs single-threaded
        # (process-wide: restored by stop()).
        self._torch_threads = torch.get_num_threads()
        torch.set_num_threads(1 if workers > 1 else workers)
        self.runner = ModelRunner(
            config.model_path,
            tokenizer_path=config.tokenizer_path,
            device=config.device,
            dtype=config.dtype,
            cpu_workers=workers,
        )
        if config.context_length is not None:
            self.runner.context_length = config.context_length
        gpu = self.runner.device.type == "cuda"
        self.limits = SchedulerLimits(
            max_running=config.max_running_requests or (256 if gpu else 64),
            max_total_tokens=_kv_budget(config, self.runner),
            max_prefill_tokens=config.max_prefill_tokens or (16384 if gpu else 8192),
        )
        self.request_limits = EngineLimits(
            vocab_size=self.runner.vocab_size,
            context_length=self.runner.context_length,
            max_total_tokens=self.limits.max_total_tokens,
        )
        self.grammars = Grammars(
            self.runner.tokenizer,
            vocab_size=self.runner.vocab_size,
            stop_token_ids=self.runner.eos_token_ids,
        )
        self.scheduler = Scheduler(
            self.runner,
            self.limits,
            weight_version=config.weight_version,
            on_progress=self._on_progress,
        )
        self.started_at = time.time()
        self.paused: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate_closers: set[str] = set()
        self._gate: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._inflight: set[int] = set()  # ids of submitted requests the engine has not finished
        self._updating = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.scheduler.start()

    async def stop(self) -> None:
        await asyncio.to_thread(self.scheduler.stop)
        torch.set_num_threads(self._torch_threads)

    @property
    def weight_version(self) -> str:
        return self.scheduler.weight_version

    @property
    def tokenizer(self) -> Any:
        return self.runner.tokenizer

    # ------------------------------------------------------------------ progress plumbing
    def _on_progress(self, requests: list[Request]) -> None:
        """Scheduler thread -> event loop: one hop per step, whatever the batch size."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, requests)

    def _wake(self, requests: list[Request]) -> None:
        for req in requests:
            if req.finished:
                # Counted out here, not when the handler gets to run: a pause or an update that
                # waits for in-flight requests is released as soon as the engine let them go.
                self._release(req)
            listener = req.listener
            if listener is not None:
                listener.set()

    def _release(self, request: Request) -> None:
        assert self._idle is not None
        self._inflight.discard(id(request))
        if not self._inflight:
            self._idle.set()

    async def _wrap(self, future: Future[Any]) -> Any:
        return await asyncio.wrap_future(future)

    def _close_gate(self, who: str) -> None:
        assert self._gate is not None
        self._gate_closers.add(who)
        self._gate.clear()

    def _open_gate(self, who: str) -> None:
        assert self._gate is not None
        self._gate_closers.discard(who)
        if not self._gate_closers:
            self._gate.set()

    @property
    def gate_closed(self) -> bool:
        return bool(self._gate_closers)

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        request: Request,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> AsyncIterator[Request]:
        """Yield ``request`` each time it has progressed; the last yield has it finished.

        Raises ``DuplicateRequestError`` before anything is yielded. Leaving early (client gone,
        task cancelled) aborts the request.
        """
        assert self._gate is not None and self._idle is not None
        while self._gate_closers:  # re-check after waking: the gate may have closed again
            await self._gate.wait()
        event = asyncio.Event()
        request.listener = event
        self._inflight.add(id(request))
        self._idle.clear()
        try:
            self.scheduler.submit(request)
            while not request.finished:
                try:
                    async with asyncio.timeout(1.0):
                        await event.wait()
                except TimeoutError:
                    if is_disconnected is not None and await is_disconnected():
                        return
                    continue
                event.clear()
                yield request
        finally:
            self._release(request)
            if not request.finished:
                self.scheduler.command("abort_request", request=request)

    async def run_to_end(
        self, request: Request, is_disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> Request:
        async for _ in self.generate(request, is_disconnected):
            pass
        return request

    # ------------------------------------------------------------------ control
    async def abort(self, rid: str = "", abort_all: bool = False) -> int:
        result: int = await self._wrap(
            self.scheduler.command("abort", rid=rid, abort_all=abort_all)
        )
        return result

    async def pause(self, mode: str) -> None:
        self._close_gate("pause")
        self.paused = mode
        if mode == "abort":
            await self._drain(abort=True)
        else:
            await self._wrap(self.scheduler.command("pause", mode=mode))

    async def resume(self) -> None:
        self.paused = None
        await self._wrap(self.scheduler.command("resume"))
        self._open_gate("pause")

    async def _drain(self, *, abort: bool) -> None:
        """Wait until no request is in flight, aborting them all (again every second) if asked."""
        assert self._idle is not None
        while self._inflight:
            if abort:
                await self.abort(abort_all=True)
            try:
                async with asyncio.timeout(_ABORT_RETRY_SEC):
                    await self._idle.wait()
            except TimeoutError:
                continue

    async def set_weight_version(self, version: str, *, abort_all_requests: bool) -> None:
        if abort_all_requests:
            await self.abort(abort_all=True)
        await self._wrap(self.scheduler.command("set_version", version=version))

    async def flush_cache(self) -> bool:
        result: bool = await self._wrap(self.scheduler.command("flush"))
        return result

    async def update_weights(
        self,
        *,
        model_path: str,
        weight_version: str | None,
        abort_all_requests: bool,
        flush_cache: bool,
    ) -> str:
        if self._updating:
            raise WeightUpdateError(
                409, "another weight update is in progress; retry after it ends"
            )
        self._updating = True
        try:
            try:
                weights = await asyncio.to_thread(self.runner.load_weights, model_path)
            except WeightLoadError as exc:
                # The reason (a missing folder, a shape) stays in the log: the answer would
                # otherwise tell a caller which paths exist on this machine.
                log.warning("update_weights_from_disk refused: %s", exc)
                raise WeightUpdateError(400, UNUSABLE_CHECKPOINT) from None
            if abort_all_requests:
                await self.abort(abort_all=True)
            drain = self.paused is None
            if drain:
                self._close_gate("update")
            try:
                if drain:
                    await self._drain(abort=False)
                future = self.scheduler.command(
                    "update_weights",
                    weights=weights,
                    model_path=model_path,
                    version=weight_version,
                    flush_cache=flush_cache,
                )
                try:
                    await self._wrap(future)
                except RuntimeError as exc:
                    raise WeightUpdateError(400, str(exc)) from None
            finally:
                if drain:
                    self._open_gate("update")
        finally:
            self._updating = False
        message = "Succeeded to update model weights."
        if weight_version is not None:
            message += f" Weight version updated to {weight_version}."
        return message

    # ------------------------------------------------------------------ health
    async def healthy(self, *, generate: bool) -> bool:
        """Alive; with ``generate``, also produces a token unless traffic is already flowing."""
        if not self.scheduler.alive:
            return False
        if not generate or self.gate_closed or self.paused:
            return True
        if self.scheduler.running and time.monotonic() - self.scheduler.last_progress < 1.0:
            return True
        probe = Request(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt_ids=[0],
            params=SamplingParams(max_new_tokens=1, temperature=0.0),
            max_new_tokens=1,
        )
        try:
            async with asyncio.timeout(_HEALTH_TIMEOUT_SEC):
                await self.run_to_end(probe)
        except TimeoutError:
            return False
        return probe.finish is not None and probe.finish.type != "abort"

    def loads(self) -> dict[str, Any]:
        return self.scheduler.loads | {
            "gate_closed": self.gate_closed,
            "weight_update_in_progress": self._updating,
        }
