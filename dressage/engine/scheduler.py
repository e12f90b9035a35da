"""The continuous-batching loop: one thread that owns the model and steps all running requests.

Each iteration, in this order:

1. take new requests and control commands (abort, pause, continue, weight update, flush);
2. unless paused, admit waiting requests into free KV slots and prefill them together (one packed
   forward);
3. decode every running request by one token in one batched forward, sample the next token of
   all of them (prefilled and decoded) in one lm_head pass, then drop the finished ones and
   compact the slots.

Commands run only at the top of an iteration, so abort, pause and weight updates always act at a
token boundary: a request never loses or duplicates a token, and a weight update never races a
forward. A pause or abort-all does not wait for the step in progress: it makes the step drop its
lm_head pass, before any token is chosen, and the step is redone later (the uniforms are a hash
of seed and position, so it picks the same tokens); the latency is a fraction of a step.

Pause modes follow SGLang: ``retract`` moves running requests back to the waiting queue keeping
their tokens (they re-prefill on continue), ``in_place`` keeps their KV and just stops stepping.
(``abort`` mode is an abort-all plus the service's request gate; see ``service.py``.)

Why not transformers' own ``ContinuousBatchingManager``: its logprobs are taken after its logits
processors (not SGLang's), it samples from one global RNG (no per-request ``sampling_seed``),
cancellation drops a request without returning its partial output, and its API changed between
transformers 5.17 (the GPU image) and 5.24 (CI).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from dressage.engine.model_runner import ModelRunner, PrefillItem
from dressage.engine.request import ABORTED, ABORTED_WAITING, FinishReason, Request
from dressage.engine.sampling import RowSpec, StepInterrupted

log = logging.getLogger(__name__)

ProgressCallback = Callable[[list[Request]], None]


class DuplicateRequestError(ValueError):
    pass


class EngineStoppedError(RuntimeError):
    pass


@dataclass
class _Command:
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    future: Future[Any] = field(default_factory=Future)


@dataclass(frozen=True)
class SchedulerLimits:
    max_running: int  # requests decoded together
    max_total_tokens: int  # KV budget in token positions (slots x capacity)
    max_prefill_tokens: int  # prompt tokens packed into one prefill forward (>= 1 request)


class Scheduler:
    """Owns the running batch. Public methods are thread-safe; the loop runs on its own thread."""

    def __init__(
        self,
        runner: ModelRunner,
        limits: SchedulerLimits,
        *,
        weight_version: str,
        on_progress: ProgressCallback,
    ) -> None:
        self.runner = runner
        self.limits = limits
        self.weight_version = weight_version
        self.on_progress = on_progress
        self.paused: str | None = None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loads: dict[str, Any] = {}
        self.last_progress = time.monotonic()
        self._cv = threading.Condition()
        # Set by a pause or abort-all: the running step drops its vocabulary pass (nothing is
        # sampled, so no token is lost or half-made) and the command runs right away.
        self._interrupt = threading.Event()
        self._inbox: deque[Request] = deque()
        self._commands: deque[_Command] = deque()
        self._live: dict[str, Request] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._produced: deque[tuple[float, int]] = deque()
        self.generated_tokens_total = 0
        self._step_ms: deque[tuple[int, float]] = deque(maxlen=64)
        self._publish_loads()

    # ------------------------------------------------------------------ thread-safe API
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dressage-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, request: Request) -> None:
        with self._cv:
            if self._stopping:
                raise EngineStoppedError("the engine is shutting down")
            if request.rid in self._live:
                raise DuplicateRequestError(f"Duplicate request ID detected: {request.rid}")
            self._live[request.rid] = request
            self._inbox.append(request)
            self._cv.notify()

    def command(self, kind: str, **args: Any) -> Future[Any]:
        """Queue a control command; its future resolves at the next token boundary."""
        cmd = _Command(kind, args)
        with self._cv:
            if self._stopping:
                cmd.future.set_exception(EngineStoppedError("the engine is shutting down"))
                return cmd.future
            self._commands.append(cmd)
            if kind == "pause" or (kind == "abort" and args.get("abort_all")):
                self._interrupt.set()
            self._cv.notify()
        return cmd.future

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._has_work():
                    self._cv.wait()
                self.waiting.extend(self._inbox)
                self._inbox.clear()
                commands = list(self._commands)
                self._commands.clear()
                self._interrupt.clear()
                stopping = self._stopping
            for cmd in commands:
                self._execute(cmd)
            if stopping:
                self._shutdown()
                return
            if self.paused is None:
                self._guarded(self._step)
                if not self.running and not self.waiting:
                    self.runner.cache.reset()
            self._publish_loads()

    def _has_work(self) -> bool:
        if self._inbox or self._commands or self._stopping:
            return True
        return self.paused is None and bool(self.running or self.waiting)

    def _guarded(self, step: Callable[[], None]) -> None:
        """A failing forward fails the batch it ran, never the loop."""
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - process boundary of the engine thread
            log.exception("engine step failed; aborting the running batch")
            reason = FinishReason("abort", message=f"engine error: {exc}", status_code=500)
            victims = self.running + [r for r in self.waiting if r.started]
            self.waiting = deque(r for r in self.waiting if not r.started)
            self.running = []
            for req in victims:
                self._finish(req, reason)
            self._notify(victims)

    # ------------------------------------------------------------------ admission and prefill
    def _admit(self) -> list[Request]:
        limits, tokens = self.limits, 0
        admitted: list[Request] = []
        longest = max((r.reserved_tokens for r in self.running), default=0)
        while self.waiting and len(self.running) + len(admitted) < limits.max_running:
            req = self.waiting[0]
            if admitted and tokens + req.num_tokens > limits.max_prefill_tokens:
                break
            need = max(longest, req.reserved_tokens)
            if (len(self.running) + len(admitted) + 1) * need > limits.max_total_tokens:
                break
            self.waiting.popleft()
            admitted.append(req)
            tokens += req.num_tokens
            longest = need
        return admitted

    def _step(self) -> None:
        """Prefill the newly admitted requests and decode the running ones, then sample every
        row with one lm_head pass (the pass costs about the same for 1 row as for 32)."""
        began = time.perf_counter()
        admitted = self._admit()
        decoding = list(self.running)
        if not admitted and not decoding:
            return
        base = len(decoding)
        for i, req in enumerate(admitted):
            req.slot = base + i
        self.running.extend(admitted)  # from here on, a failure aborts them with the rest
        positions = [r.num_tokens - 1 for r in decoding]
        self._ensure_cache(
            base + len(admitted),
            max([p + 1 for p in positions] + [r.num_tokens for r in admitted]),
            live=decoding,
        )
        rows: list[Request] = []
        hiddens: list[torch.Tensor] = []
        if decoding:
            tokens = [r.output_ids[-1] for r in decoding]
            hiddens.append(self.runner.decode(tokens, positions))
            rows += decoding
        if admitted:
            sampling, last = self._prefill(admitted)
            hiddens.append(last)
            rows += sampling
        if rows:
            hidden = hiddens[0] if len(hiddens) == 1 else torch.cat(hiddens)
            try:
                self._sample_and_append(rows, hidden)
            except StepInterrupted:
                # Redone after the command: the same KV is rewritten, the same uniforms drawn.
                self.running = decoding
                for req in admitted:
                    req.slot = -1
                self.waiting.extendleft(reversed([r for r in admitted if not r.finished]))
                return
        self._drop_finished(decoding + admitted)
        if decoding:
            self._step_ms.append((len(rows), (time.perf_counter() - began) * 1000.0))

    def _prefill(self, admitted: list[Request]) -> tuple[list[Request], torch.Tensor]:
        """One packed forward over the admitted prompts (plus, for retracted requests, what they
        had generated). -> (requests that now sample a token, their last hidden states)."""
        hidden = self.runner.prefill([PrefillItem(r.slot, r.all_tokens()) for r in admitted])
        last, offset = [], 0
        for req in admitted:
            if req.return_logprob and req.input_logprobs is None:
                req.input_logprobs = self._prompt_logprobs(req, hidden, offset)
            offset += req.num_tokens
            last.append(offset - 1)
            req.started = True
        sampling, done = [], []
        for req, row in zip(admitted, last, strict=True):
            if len(req.output_ids) >= req.max_new_tokens:  # max_new_tokens == 0: prefill only
                self._finish(req, FinishReason("length", length=req.max_new_tokens))
                done.append(req)
            else:
                sampling.append(row)
        self._notify(done)
        keep = [r for r in admitted if not r.finished]
        index = torch.tensor(sampling, dtype=torch.long).to(hidden.device)
        return keep, hidden[index]

    def _prompt_logprobs(
        self, req: Request, hidden: torch.Tensor, offset: int
    ) -> list[float | None]:
        """SGLang's input_token_logprobs: positions logprob_start_len .. n-1, the first one null."""
        n = len(req.prompt_ids)
        start = n if req.logprob_start_len < 0 else req.logprob_start_len
        if start >= n:
            return []
        rows = hidden[offset + start : offset + n - 1]
        values = self.runner.prompt_logprobs(rows, req.prompt_ids[start + 1 : n])
        return [None, *values]

    # ------------------------------------------------------------------ sampling
    def _sample_and_append(self, batch: list[Request], hidden: torch.Tensor) -> None:
        rows = [
            RowSpec.of(
                r.params,
                r.next_uniform(),
                r.grammar.next_mask() if r.grammar is not None else None,
                r.top_logprobs_num if r.return_logprob else 0,
            )
            for r in batch
        ]
        tokens, logprobs, tops = self.runner.sample_rows(hidden, rows, self._interrupt)
        version, eos = self.weight_version, self.runner.eos_token_ids
        tokenizer = self.runner.tokenizer
        for req, token, logprob, top in zip(batch, tokens, logprobs, tops, strict=True):
            req.append(token, logprob, version, top)
            skip = req.params.skip_special_tokens
            reason = req.check_stop(
                eos, lambda ids, skip=skip: tokenizer.decode(ids, skip_special_tokens=skip)
            )
            if req.grammar is not None and reason is None:
                reason = _grammar_end(req, token)
            if reason is not None:
                self._finish(req, reason)
        now = time.monotonic()
        self._produced.append((now, len(batch)))
        self.generated_tokens_total += len(batch)
        self.last_progress = now
        self._notify([r for r in batch if r.stream or r.finished])

    # ------------------------------------------------------------------ slots
    def _ensure_cache(self, slots: int, length: int, live: list[Request]) -> None:
        """Room for ``slots`` x ``length``; the KV of ``live`` (slots 0 .. len-1) survives."""
        longest = max([r.reserved_tokens for r in self.running] + [length])
        self.runner.cache.ensure(
            slots=slots,
            length=length,
            live_slots=len(live),
            live_len=max((r.num_tokens for r in live), default=0),
            max_slots=self.limits.max_running,
            max_len=longest,
            max_tokens=self.limits.max_total_tokens,
        )

    def _drop_finished(self, batch: list[Request]) -> None:
        gone = [r for r in batch if r.finished and r.slot >= 0]
        if gone:
            self._release(gone)

    def _release(self, gone: list[Request]) -> None:
        """Take ``gone`` out of the running batch and compact: the highest slots move down."""
        gone_set = set(map(id, gone))
        keep = [r for r in self.running if id(r) not in gone_set]
        free = sorted(r.slot for r in gone if r.slot < len(keep))
        movers = sorted((r for r in keep if r.slot >= len(keep)), key=lambda r: r.slot)
        for dst, req in zip(free, movers, strict=True):
            self.runner.cache.move_slot(
                req.slot, dst, min(req.num_tokens, self.runner.cache.capacity)
            )
            req.slot = dst
        for req in gone:
            req.slot = -1
        self.running = sorted(keep, key=lambda r: r.slot)

    # ------------------------------------------------------------------ finishing
    def _finish(self, req: Request, reason: FinishReason) -> None:
        req.set_finished(reason, self.weight_version)
        with self._cv:
            self._live.pop(req.rid, None)

    def _notify(self, requests: list[Request]) -> None:
        if requests:
            try:
                self.on_progress(requests)
            except Exception:  # noqa: BLE001 - a broken listener must not stop the engine
                log.exception("progress callback failed")

    # ------------------------------------------------------------------ commands
    def _execute(self, cmd: _Command) -> None:
        try:
            handler = getattr(self, f"_cmd_{cmd.kind}")
            cmd.future.set_result(handler(**cmd.args))
        except Exception as exc:  # noqa: BLE001 - reported to the caller through the future
            cmd.future.set_exception(exc)

    def _cmd_abort(self, rid: str = "", abort_all: bool = False) -> int:
        if not abort_all and not rid:
            return 0

        def hit(req: Request) -> bool:
            return abort_all or req.rid.startswith(rid)

        running = [r for r in self.running if hit(r)]
        waiting = [r for r in self.waiting if hit(r)]
        if running:
            for req in running:
                self._finish(req, ABORTED)
            self._release(running)
        if waiting:
            self.waiting = deque(r for r in self.waiting if not hit(r))
            for req in waiting:
                self._finish(req, ABORTED_WAITING)
        self._notify(running + waiting)
        return len(running) + len(waiting)

    def _cmd_abort_request(self, request: Request) -> int:
        """Abort exactly this request (its client went away)."""
        if request.finished:
            return 0
        if request in self.running:
            self._finish(request, ABORTED)
            self._release([request])
        elif request in self.waiting:
            self.waiting.remove(request)
            self._finish(request, ABORTED_WAITING)
        else:
            return 0
        self._notify([request])
        return 1

    def _cmd_set_version(self, version: str) -> None:
        self.weight_version = version

    def _cmd_pause(self, mode: str) -> int:
        if mode == "retract" and self.running:
            for req in self.running:
                req.slot = -1
                req.num_retractions += 1
            self.waiting.extendleft(reversed(self.running))
            self.running = []
        self.paused = mode
        return 0

    def _cmd_resume(self) -> None:
        self.paused = None

    def _cmd_flush(self) -> bool:
        """Succeeds only when nothing runs (queued requests do not count while paused)."""
        return not self.running and (self.paused is not None or not self.waiting)

    def _cmd_update_weights(
        self,
        weights: dict[str, torch.Tensor],
        model_path: str,
        version: str | None,
        flush_cache: bool,
    ) -> None:
        if flush_cache and self.running:
            raise RuntimeError(
                f"cannot flush the cache while {len(self.running)} requests hold KV in the running "
                "batch (in_place pause); pass flush_cache=false to keep their KV"
            )
        self.runner.apply_weights(weights, model_path)
        if version is not None:
            self.weight_version = version

    def _cmd_ping(self) -> bool:
        return True

    def _shutdown(self) -> None:
        reason = FinishReason("abort", message="engine shutting down", status_code=503)
        victims = self.running + list(self.waiting)
        self.running, self.waiting = [], deque()
        for req in victims:
            self._finish(req, reason)
        self._notify(victims)
        with self._cv:
            pending = list(self._commands)
            self._commands.clear()
        for cmd in pending:
            cmd.future.set_exception(EngineStoppedError("the engine is shutting down"))

    # ------------------------------------------------------------------ loads
    def _publish_loads(self) -> None:
        now = time.monotonic()
        while self._produced and now - self._produced[0][0] > 5.0:
            self._produced.popleft()
        produced = sum(n for _, n in self._produced)
        span = max(now - self._produced[0][0], 1e-3) if self._produced else 1.0
        used = sum(r.num_tokens for r in self.running)
        limits = self.limits
        last = self._step_ms[-1] if self._step_ms else (0, 0.0)
        self.loads = {
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_waiting_uncached_tokens": sum(r.num_tokens for r in self.waiting),
            "num_used_tokens": used,
            "num_active_tokens": used,
            "max_total_num_tokens": limits.max_total_tokens,
            "max_running_requests": limits.max_running,
            "token_usage": used / limits.max_total_tokens,
            "gen_throughput": produced / span if self._produced else 0.0,
            "generated_tokens_total": self.generated_tokens_total,
            "cache_hit_rate": 0.0,
            "utilization": len(self.running) / limits.max_running,
            "paused": self.paused,
            "decode_step_ms": last[1],
            "decode_batch_size": last[0],
            "decode_step_ms_avg": (
                sum(ms for _, ms in self._step_ms) / len(self._step_ms) if self._step_ms else 0.0
            ),
        }


def _grammar_end(req: Request, token: int) -> FinishReason | None:
    """Advance the request's grammar by ``token``: a complete grammar ends the request at its
    stop token; a token the grammar refuses (never sampled: it was masked) is an error."""
    if not req.grammar.accept(token):
        return FinishReason(
            "abort", message=f"token {token} breaks the request's grammar", status_code=500
        )
    if req.grammar.terminated:
        return FinishReason("stop", matched=token)
    return None
