"""JobTrigger: waits in the triggerer for a launched job to end, and fires exactly one event.

It polls the launcher's async status client (``dressage.launch``: httpx against the Ray REST
API, or file and /proc reads moved to a thread for local jobs; nothing blocks the loop, nothing
imports ray) every ``poll_s`` seconds, streams new lines of the job's log into the trigger log,
and yields one :class:`TriggerEvent` with a payload of
``{"submission_id", "state", "message", "exit_code", "log"}`` (the id of the attempt that ran,
which on Ray may be ``<id>-rN``), where ``state`` is SUCCEEDED,
FAILED, STOPPED, TIMEOUT (``deadline`` passed) or ERROR (the job vanished, or its status could
not be read ``max_poll_failures`` times in a row). A user killing the deferred task stops the
job through :meth:`JobTrigger.on_kill`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from dressage.launch.base import AsyncStatusClient, JobStatus, LaunchError, status_client_for

__all__ = ["JobTrigger"]


class JobTrigger(BaseTrigger):
    def __init__(
        self,
        *,
        launcher: str,
        launcher_options: dict[str, Any],
        submission_id: str,
        poll_s: float = 5.0,
        deadline: float | None = None,
        stream_logs: bool = True,
        log_offset: int = 0,
        max_poll_failures: int = 5,
    ) -> None:
        super().__init__()
        self.launcher = launcher
        self.launcher_options = dict(launcher_options)
        self.submission_id = submission_id
        self.poll_s = float(poll_s)
        self.deadline = deadline
        self.stream_logs = stream_logs
        self.log_offset = int(log_offset)
        self.max_poll_failures = int(max_poll_failures)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "launcher": self.launcher,
                "launcher_options": dict(self.launcher_options),
                "submission_id": self.submission_id,
                "poll_s": self.poll_s,
                "deadline": self.deadline,
                "stream_logs": self.stream_logs,
                "log_offset": self.log_offset,
                "max_poll_failures": self.max_poll_failures,
            },
        )

    def _event(self, state: str, message: str, status: JobStatus | None = None) -> TriggerEvent:
        return TriggerEvent(
            {
                "submission_id": status.submission_id if status else self.submission_id,
                "state": state,
                "message": message,
                "exit_code": status.exit_code if status else None,
                "log": status.log if status else "",
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client = status_client_for(self.launcher, self.launcher_options)
        failures = 0
        try:
            while True:
                try:
                    status = await client.status(self.submission_id)
                    await self._stream(client)
                    failures = 0
                except LaunchError as exc:
                    failures += 1
                    self.log.warning("status of %s unavailable: %s", self.submission_id, exc)
                    if failures >= self.max_poll_failures:
                        yield self._event("ERROR", f"{failures} status polls failed: {exc}")
                        return
                    await asyncio.sleep(self.poll_s)
                    continue
                if status is None:
                    yield self._event("ERROR", f"job {self.submission_id} does not exist")
                    return
                if status.state.terminal:
                    yield self._event(status.state.value, status.message, status)
                    return
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event("TIMEOUT", "the job ran past its timeout", status)
                    return
                await asyncio.sleep(self._pause())
        finally:
            await client.aclose()

    def _pause(self) -> float:
        if self.deadline is None:
            return self.poll_s
        return max(0.0, min(self.poll_s, self.deadline - time.time()))

    async def _stream(self, client: AsyncStatusClient) -> None:
        if not self.stream_logs:
            return
        text, self.log_offset = await client.read_log(self.submission_id, self.log_offset)
        for line in text.splitlines():
            self.log.info("job | %s", line)

    async def on_kill(self) -> None:
        client = status_client_for(self.launcher, self.launcher_options)
        try:
            await client.stop(self.submission_id)
        finally:
            await client.aclose()
