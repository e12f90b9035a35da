"""The trainer's pause client: whether and how it pauses the proxy around a weight update.

    settings = PauseClientSettings.layered({"proxy_url": url, "admin_key": None}, given_as={})

Each field has its variable (``ENV``); a value the caller gives wins over the variable, the
variable over the default. ``DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE`` and
``DRESSAGE_PROXY_PAUSE_REQUIRED`` are declared here; the URL, the admin key and the timeout are
the proxy's own variables (the timeout's default is the proxy's, :data:`DEFAULT_PAUSE_TIMEOUT_S`,
bounded as the proxy bounds it). What the client does with them:
:mod:`dressage.training.proxy_pause_client`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from dressage.config.layered import LayeredSettings, declare_variables
from dressage.config.proxy import DEFAULT_PAUSE_TIMEOUT_S, MAX_PAUSE_TIMEOUT_S, PROXY_ENV

__all__ = ["PauseClientSettings"]


class PauseClientSettings(LayeredSettings):
    """How the trainer pauses the proxy (see the module docstring)."""

    ENV: ClassVar[Mapping[str, str]] = {
        "proxy_url": "DRESSAGE_PROXY_URL",
        "admin_key": PROXY_ENV["admin_key"],
        "enabled": "DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE",
        "required": "DRESSAGE_PROXY_PAUSE_REQUIRED",
        "timeout_s": PROXY_ENV["pause_timeout_s"],
    }
    SECRETS: ClassVar[frozenset[str]] = frozenset({"admin_key"})
    WHAT: ClassVar[str] = "proxy pause settings"

    proxy_url: str | None = None
    admin_key: str | None = None
    enabled: bool = Field(
        True, description="Pause proxy generation around every weight update (async drivers)."
    )
    required: bool = Field(
        False,
        description="Fail the weight update when the proxy cannot be paused (otherwise warn and "
        "go on).",
    )
    timeout_s: float = Field(DEFAULT_PAUSE_TIMEOUT_S, gt=0, le=MAX_PAUSE_TIMEOUT_S)


declare_variables(PauseClientSettings, ("enabled", "required"))
