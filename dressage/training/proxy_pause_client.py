"""Pause the proxy's generation around a weight update, and resume it with the new version.

    pause = RolloutPause.from_env(proxy_url="http://127.0.0.1:8000")
    version = update_weights_with_pause(pause, backend.update_weights, reason="rollout 7")

``update_weights_with_pause`` asks the proxy to stop generation at a token boundary
(``POST /v1/rollout/pause``), runs the update, then resumes with the version the update
returned (``POST /v1/rollout/resume``; None lets the proxy read the engine's), even when the
update failed, so that no agent stays held. Three variables steer it (layered by
:class:`~dressage.config.pause_client.PauseClientSettings`):

- ``DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE`` (1): 0 updates without pausing (in-flight calls
  then see their engine request aborted by the engine's own pause: the work is lost);
- ``DRESSAGE_PROXY_PAUSE_REQUIRED`` (0): 1 makes a pause that fails (no proxy URL, proxy down,
  engine refusing) fail the update; otherwise it is logged and the update goes on unpaused;
- ``DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC`` (300): the proxy resumes by itself after this long.

The admin key is ``DRESSAGE_PROXY_ADMIN_KEY``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from dressage.config.pause_client import PauseClientSettings
from dressage.config.proxy import DEFAULT_PAUSE_TIMEOUT_S
from dressage.proxy.client import ProxyClientError, SyncProxyClient

__all__ = ["RolloutPause", "RolloutPauseError", "update_weights_with_pause"]

log = logging.getLogger(__name__)


class RolloutPauseError(RuntimeError):
    """A required pause or resume failed; the message names the proxy and the update."""


@dataclass
class RolloutPause:
    """The proxy pause policy of one training run (see the module docstring)."""

    proxy_url: str | None
    admin_key: str | None = None
    enabled: bool = True
    required: bool = False
    timeout_s: float = DEFAULT_PAUSE_TIMEOUT_S
    mode: str = "abort"
    events: list[dict[str, Any]] = field(default_factory=list)
    """One entry per update: the pause and resume reports (or the error), for metrics."""
    _client: SyncProxyClient | None = None

    @classmethod
    def from_env(
        cls, *, proxy_url: str | None = None, admin_key: str | None = None, mode: str = "abort"
    ) -> RolloutPause:
        """The policy from ``DRESSAGE_PROXY_*`` (:class:`PauseClientSettings`); a URL or key
        given here wins over its variable."""
        given = {"proxy_url": proxy_url, "admin_key": admin_key}
        settings = PauseClientSettings.layered(given, given_as={})
        return cls(**settings.model_dump(), mode=mode)

    def client(self) -> SyncProxyClient:
        if self._client is None:
            assert self.proxy_url is not None
            # the pause answers once generation stopped: allow it the whole pause timeout
            self._client = SyncProxyClient(
                self.proxy_url, admin_key=self.admin_key, timeout=self.timeout_s + 60.0
            )
        return self._client

    def _failed(self, what: str, reason: str, error: object) -> None:
        message = f"{what} of the proxy at {self.proxy_url} for {reason!r} failed: {error}"
        if self.required:
            raise RolloutPauseError(message + " (DRESSAGE_PROXY_PAUSE_REQUIRED=1)")
        log.warning("%s; the weight update goes on unpaused", message)

    def pause(self, reason: str) -> dict[str, Any] | None:
        """The pause report, or None when the update goes on unpaused."""
        if not self.enabled:
            return None
        if not self.proxy_url:
            self._failed("pause", reason, "no proxy URL (DRESSAGE_PROXY_URL)")
            return None
        try:
            return self.client().pause_rollout(
                reason, mode=self.mode, timeout_seconds=self.timeout_s
            )
        except (ProxyClientError, httpx.HTTPError) as exc:
            self._failed("pause", reason, exc)
            return None

    def resume(self, version: int | None, reason: str) -> dict[str, Any] | None:
        try:
            return self.client().resume_rollout(version, reason)
        except (ProxyClientError, httpx.HTTPError) as exc:
            if self.required:
                raise RolloutPauseError(
                    f"resume of the proxy at {self.proxy_url} for {reason!r} (version "
                    f"{version}) failed: {exc}; it resumes by itself after {self.timeout_s} s"
                ) from exc
            log.warning(
                "resume of the proxy at %s for %r failed: %s; it resumes by itself after %s s",
                self.proxy_url, reason, exc, self.timeout_s,
            )  # fmt: skip
            return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def update_weights_with_pause(
    pause: RolloutPause, update: Callable[[], int | None], *, reason: str
) -> int | None:
    """Pause, ``update()`` (returns the new weight version, or None), resume; see the module
    docstring. Returns what ``update`` returned."""
    started = time.monotonic()
    paused = pause.pause(reason)
    update_started = time.monotonic()
    version: int | None = None
    event: dict[str, Any] = {"reason": reason, "paused": paused is not None}
    try:
        version = update()
    finally:
        updated = time.monotonic()
        resumed = pause.resume(version, reason) if paused is not None else None
        event.update(
            pause=paused,
            resume=resumed,
            version=version,
            pause_s=update_started - started,
            update_s=updated - update_started,
            resume_s=time.monotonic() - updated,
        )
        pause.events.append(event)
    return version
