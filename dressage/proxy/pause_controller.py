"""The proxy-wide pause: all generation stopped at a token boundary for a weight update.

:class:`PauseController` holds one state for the whole proxy: the gate every engine request
passes, and what an ``abort`` means for the call it stopped. It runs no engine request itself:
each agent call's requests are sent, and re-sent after a pause, by
:mod:`~dressage.proxy.generation_controller`. This docstring is the pause contract; the routes,
the sessions and the settings point here.

    POST /v1/rollout/pause   {"reason": "update 7", "mode": "abort", "timeout_seconds": 300}
    POST /v1/rollout/resume  {"version": 8, "reason": "update 7"}
    GET  /v1/rollout/pause_state

A pause closes the proxy's gate (new engine requests, from new chat calls or from resumed ones,
wait in the proxy; the agents' HTTP calls stay open, nothing fails), then pauses every engine
worker with ``/pause_generation`` in the requested mode (docs/sglang.md §3), and answers once
generation has stopped, with the number of calls it stopped and how long that took:

- ``abort`` (default; what slime's own updaters use): the engine aborts everything in flight and
  each request comes back with its partial output (ids, log-probs, versions) at a token boundary.
  The controller keeps it in the call's generation and parks the call. After the resume the
  call continues from ``prompt + partial output`` with the remaining token budget (with
  ``--dressage-partial-rollout``), or starts again from its prompt (without it: the baseline that
  loses the in-flight work; a streamed call that already sent tokens then ends with
  ``finish_reason`` abort instead, since sent text cannot be taken back).
- ``retract`` / ``in_place``: the engine keeps the requests (retract frees their KV cache and
  re-prefills under the new weights; in_place keeps it, so weight updates must not flush the
  cache). The proxy keeps their calls open and only holds new requests; the engine's
  ``weight_versions`` spans label each token (SGLang >= 0.5.23, and the embedded engine).

Partial rollout per call: the rollout side may ask it of single calls while the proxy-wide switch is
off, and those calls continue as with the switch. A client the rollout builds sends the header
``X-Dressage-Partial-Rollout: 1`` on a chat call (``0`` or no header leaves it to the switch and the
session's flag, so a call cannot turn them off; any other value is a 400 naming the header:
:func:`~dressage.proxy.pause_requests.parse_partial_rollout_header`). A black-box command agent only
gets a base URL, so its calls carry no header of ours: the rollout opens its session with
``partial_rollout`` (``POST /v1/sessions/{id}/open``, admin key) before the agent starts, and the
flag is kept in the store (it survives a restart). The step records who asked
(``extra["partial_rollout"]``: ``header`` or ``session``), and a segment opened by such a call
records ``dressage_partial_rollout: true`` in its flags.

A second pause while paused changes nothing and answers 200 with the current state
(``already_paused: true``), or 409 when it asks for another mode. A resume sets the proxy's
weight version (``version``; omitted: the engine's, from ``/model_info``, unless that is older),
continues every worker (``/continue_generation``) and releases every held call; a version older
than the proxy's is 409 and changes nothing; a resume while not paused is a 200 no-op
(``was_paused: false``) that still syncs the version. A pause that is never resumed ends by
itself after ``timeout_seconds`` (default ``--pause-timeout-sec``,
``DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC``; at most :data:`~dressage.config.proxy.MAX_PAUSE_TIMEOUT_S`),
with a warning. A pause the engine
refuses is a 503 naming the engine, and generation goes on. ``pause_state`` answers the state:
paused or not, mode, reason, deadline, weight version, the calls parked, waiting and in flight,
and the last pause and resume reports. All three routes take the admin key (when the proxy has
one: 401 without it); a malformed body is a 400 naming the field.

What a call sees and records: during a pause the agent's HTTP call just takes longer. A call
that continues after the pause records one step holding every token with the version that
produced it, and ``extra["pauses"]``. If the engine died while paused, the resume still releases
the calls and answers 503 naming the engine; each released call then fails with 503, and its
partial output is first recorded as a step with finish reason ``abort`` and
``extra["engine_error"]``.

An abort counts as the proxy's own when the proxy is paused, or when a pause began after the
engine request was admitted (its answer may arrive after the resume); any other abort is final
(:mod:`~dressage.proxy.sessions` records it). Each session also counts the pauses since its first
call: past ``--max-pauses-per-trajectory`` (0: no cap) its calls end with 409
``max_pauses_exceeded`` and the session is marked to train nothing (``no_grad_reason`` in the
store; the step that was cut short is recorded first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

from dressage.config.proxy import DEFAULT_PAUSE_TIMEOUT_S
from dressage.proxy.engine_answers import EngineError, parse_version
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.errors import Conflict, EngineFailure, PauseCapExceeded
from dressage.proxy.generation_controller import Generation
from dressage.proxy.pause_requests import PauseRequest, ResumeRequest

__all__ = ["PauseController"]

log = logging.getLogger(__name__)

_SETTLE_S = 2.0
"""After the engine paused: how long aborted answers still in transit may take to arrive (a
request admitted just before the pause may instead be held at the engine's own gate)."""


class PauseController:
    """The proxy's pause state, its gate and its resume policy (see the module docstring)."""

    def __init__(
        self,
        engine: EngineClient,
        *,
        keep_partial: bool,
        max_pauses_per_trajectory: int = 0,
        default_timeout_s: float = DEFAULT_PAUSE_TIMEOUT_S,
    ) -> None:
        self.engine = engine
        self.keep_partial = keep_partial
        self.cap = max_pauses_per_trajectory
        self.default_timeout_s = default_timeout_s
        self.paused = False
        self.reason = ""
        self.mode: str | None = None
        self.since: float | None = None
        self._deadline: float | None = None
        self.epoch = 0
        """Pauses begun so far; an engine request admitted at a smaller epoch was paused."""
        self.weight_version: int | None = None
        self.auto_resumes = 0
        self.last_pause: dict[str, Any] | None = None
        self.last_resume: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._running = asyncio.Event()
        self._running.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._unparked = asyncio.Event()
        self._unparked.set()
        self._active = 0
        self._parked = 0
        self._waiting = 0
        self._first_epoch: dict[str, int] = {}
        self._timer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------ the gate
    def _spanned(self, session_id: str) -> int:
        return self.epoch - self._first_epoch.setdefault(session_id, self.epoch)

    def _check_cap(self, session_id: str) -> None:
        spanned = self._spanned(session_id)
        if self.cap and spanned > self.cap:
            raise PauseCapExceeded(self._cap_message(session_id, spanned))

    def _cap_message(self, session_id: str, spanned: int) -> str:
        return (
            f"session {session_id} has spanned {spanned} rollout pauses, more than "
            f"--max-pauses-per-trajectory={self.cap}: the call ends and the trajectory trains "
            "nothing; start a new session"
        )

    def admit_now(self, session_id: str, generation: Generation) -> bool:
        if self.paused:
            return False
        if _first_request(generation):
            self._check_cap(session_id)
        self._enter(generation)
        return True

    async def admit(self, session_id: str, generation: Generation) -> None:
        if self.admit_now(session_id, generation):
            return
        first_request = _first_request(generation)
        if first_request:
            self._check_cap(session_id)
        while self.paused:  # re-checked after waking: another pause may have begun
            self._waiting += 1
            try:
                await self._running.wait()
            finally:
                self._waiting -= 1
        if first_request:  # the pause may have put the session over the cap
            self._check_cap(session_id)
        self._enter(generation)

    def _enter(self, generation: Generation) -> None:
        generation.epoch = self.epoch
        self._active += 1
        self._idle.clear()

    def release(self, generation: Generation) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    def forget(self, session_id: str) -> None:
        self._first_epoch.pop(session_id, None)

    # ------------------------------------------------------------------------------ the policy
    async def should_resume(self, session_id: str, generation: Generation) -> bool:
        if not (self.paused or generation.epoch < self.epoch):
            return False  # not our pause: the abort is final
        spanned = self._spanned(session_id)
        if self.cap and spanned > self.cap:
            generation.no_grad_reason = self._cap_message(session_id, spanned)
            return False
        if not (self.keep_partial or generation.keep_partial):
            if generation.streamed:
                return False
            generation.discard_partial()
        self._parked += 1
        self._unparked.clear()
        try:
            while self.paused:
                await self._running.wait()
        finally:
            self._parked -= 1
            if self._parked == 0:
                self._unparked.set()
        generation.pauses += 1
        return True

    # ------------------------------------------------------------------------------ control
    async def pause(self, request: PauseRequest) -> dict[str, Any]:
        async with self._lock:
            if self.paused:
                if request.mode != self.mode:
                    raise Conflict(
                        f"pause {request.reason!r}: the proxy is already paused in mode "
                        f"{self.mode!r} (reason {self.reason!r}); resume before pausing in "
                        f"mode {request.mode!r}",
                        code="pause_mode_conflict",
                    )
                return {**self.state(), "already_paused": True}
            return await self._pause_locked(request)

    async def _pause_locked(self, request: PauseRequest) -> dict[str, Any]:
        started = time.monotonic()
        self.paused, self.reason, self.mode = True, request.reason, request.mode
        self.since, self._deadline = time.time(), started + request.timeout_s
        self._running.clear()
        self.epoch += 1
        in_flight = self._active
        try:
            await self.engine.pause(request.mode)
        except (EngineError, httpx.HTTPError) as exc:
            self._open()
            await self._best_effort_continue()  # workers that did pause must not stay paused
            raise EngineFailure(
                f"pause {request.reason!r}: the engine at {self.engine.url} could not pause "
                f"({exc}); generation goes on",
                status=503,
                code="engine_unavailable",
            ) from None
        held = 0
        if request.mode == "abort":
            try:
                async with asyncio.timeout(_SETTLE_S):
                    await self._idle.wait()
            except TimeoutError:
                held = self._active
        if self.weight_version is None:
            self.weight_version = await self._engine_version()
        report = {
            "paused": True,
            "already_paused": False,
            "reason": request.reason,
            "mode": request.mode,
            "paused_calls": self._parked if request.mode == "abort" else in_flight,
            "in_flight_at_pause": in_flight,
            "held_at_engine": held,
            "latency_s": round(time.monotonic() - started, 6),
            "timeout_seconds": request.timeout_s,
            "weight_version": self.weight_version,
            "pauses": self.epoch,
        }
        self.last_pause = report
        self._timer = asyncio.get_running_loop().create_task(
            self._expire(self.epoch, request.timeout_s)
        )
        log.info("rollout paused (%s): %s", request.mode, report)
        return report

    async def resume(self, request: ResumeRequest) -> dict[str, Any]:
        async with self._lock:
            current = self.weight_version
            if request.version is not None and current is not None and request.version < current:
                raise Conflict(
                    f"resume {request.reason!r}: version {request.version} is older than the "
                    f"proxy's weight version {current}; nothing changed (paused: {self.paused})",
                    code="stale_weight_version",
                )
            if not self.paused:
                if request.version is not None:
                    self.weight_version = request.version
                return {
                    "resumed": False,
                    "was_paused": False,
                    "reason": request.reason,
                    "released_calls": 0,
                    "weight_version": self.weight_version,
                }
            return await self._resume_locked(request.version, request.reason, auto=False)

    async def _resume_locked(
        self, version: int | None, reason: str, *, auto: bool
    ) -> dict[str, Any]:
        started = time.monotonic()
        self._cancel_timer()
        engine_error: Exception | None = None
        try:
            await self.engine.resume()
        except (EngineError, httpx.HTTPError) as exc:
            engine_error = exc
        engine_version = None if engine_error else await self._engine_version()
        if version is None:  # the engine's version, but the proxy's never goes back
            known = [v for v in (engine_version, self.weight_version) if v is not None]
            version = max(known) if known else None
        self.weight_version = version
        # abort mode parks calls in the proxy; the other modes leave them open at the engine
        released = self._parked + (self._active if self.mode != "abort" else 0)
        paused_for = time.time() - (self.since or time.time())
        self._open()
        try:
            async with asyncio.timeout(_SETTLE_S):
                await self._unparked.wait()
        except TimeoutError:
            log.warning("resume %r: %d calls still parked", reason, self._parked)
        report: dict[str, Any] = {
            "resumed": True,
            "was_paused": True,
            "auto": auto,
            "reason": reason,
            "released_calls": released,
            "weight_version": version,
            "engine_weight_version": engine_version,
            "paused_for_s": round(paused_for, 6),
            "latency_s": round(time.monotonic() - started, 6),
        }
        if engine_version is not None and version is not None and engine_version != version:
            report["warning"] = (
                f"the engine reports weight version {engine_version}, the resume said {version}"
            )
            log.warning("resume %r: %s", reason, report["warning"])
        self.last_resume = report
        if engine_error is not None:
            raise EngineFailure(
                f"resume {reason!r}: the engine at {self.engine.url} could not continue "
                f"({engine_error}); {released} paused calls were released and will fail",
                status=503,
                code="engine_unavailable",
            )
        log.info("rollout resumed: %s", report)
        return report

    async def _best_effort_continue(self) -> None:
        try:
            await self.engine.resume()
        except (EngineError, httpx.HTTPError) as exc:
            log.warning("could not continue the engine after a failed pause: %s", exc)

    def _open(self) -> None:
        self.paused, self.mode, self.reason = False, None, ""
        self.since = self._deadline = None
        self._running.set()

    async def _engine_version(self) -> int | None:
        try:
            return parse_version(await self.engine.weight_version())
        except (EngineError, httpx.HTTPError, ValueError) as exc:
            log.warning("could not read the engine's weight version: %s", exc)
            return None

    async def _expire(self, epoch: int, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        async with self._lock:
            if not (self.paused and self.epoch == epoch):
                return
            self._timer = None  # this task: _resume_locked must not cancel it
            log.warning(
                "rollout pause %r (mode %s) was not resumed within %.1f s: resuming by itself "
                "with the engine's weight version", self.reason, self.mode, timeout_s,
            )  # fmt: skip
            self.auto_resumes += 1
            try:
                await self._resume_locked(None, f"timeout after {timeout_s:g} s", auto=True)
            except EngineFailure as exc:
                log.warning("automatic resume: %s", exc)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def close(self) -> None:
        """At shutdown: stop the timer and let held calls go (they fail on the closed engine)."""
        self._cancel_timer()
        self._open()

    def state(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "paused": self.paused,
            "reason": self.reason,
            "mode": self.mode,
            "since": self.since,
            "paused_for_s": None if self.since is None else round(time.time() - self.since, 6),
            "deadline_in_s": None if self._deadline is None else round(self._deadline - now, 3),
            "weight_version": self.weight_version,
            "pauses": self.epoch,
            "auto_resumes": self.auto_resumes,
            "paused_calls": self._parked,
            "waiting_calls": self._waiting,
            "in_flight": self._active,
            "partial_rollout": self.keep_partial,
            "max_pauses_per_trajectory": self.cap,
            "last_pause": self.last_pause,
            "last_resume": self.last_resume,
        }


def _first_request(generation: Generation) -> bool:
    """The call's first engine request (not one after a pause): the pause cap is checked then."""
    return generation.engine_requests == 0 and not generation.pauses
