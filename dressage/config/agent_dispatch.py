"""The black-box rollout's agent dispatch: which proxy, which agent, how long, how often.

    settings = AgentDispatchSettings.from_args(args)   # args, then DRESSAGE_*, then defaults

slime puts the keys of ``--custom-config-path run.yaml`` on ``args``, so a run sets them there;
an attribute that is set (not None, not "") wins over its variable (``ENV``), a variable over the
field's default. Partial rollout is on when any source turns it on: slime's
``--partial-rollout``, ``dressage_partial_rollout`` or ``DRESSAGE_AGENT_PARTIAL_ROLLOUT``. The
``DRESSAGE_AGENT*`` variables are declared here; the proxy URL and keys are the proxy's. The
table of attributes and variables, and what the dispatch does with them:
:mod:`dressage.rollout.generate.settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import Field

from dressage.config.layered import LayeredSettings, SettingsError, declare_variables
from dressage.config.proxy import PROXY_ENV

__all__ = ["ARGS", "AgentDispatchSettings"]

ARGS: Mapping[str, str] = {
    "proxy_url": "dressage_proxy_url",
    "admin_key": "dressage_proxy_admin_key",
    "api_key": "dressage_proxy_api_key",
    "agent": "dressage_agent",
    "timeout_s": "dressage_agent_timeout",
    "attempts": "dressage_agent_attempts",
    "max_turns": "dressage_agent_max_turns",
}
"""Field -> the slime ``args`` attribute that sets it (partial rollout: two, see above)."""
_PARTIAL_ROLLOUT_ARGS = ("partial_rollout", "dressage_partial_rollout")
_TRUE = ("1", "true", "yes", "on")


class AgentDispatchSettings(LayeredSettings):
    """The run-level dispatch settings (a sample's ``metadata`` may override the agent's)."""

    ENV: ClassVar[Mapping[str, str]] = {
        "proxy_url": "DRESSAGE_PROXY_URL",
        "admin_key": PROXY_ENV["admin_key"],
        "api_key": PROXY_ENV["api_key"],
        "agent": "DRESSAGE_AGENT",
        "timeout_s": "DRESSAGE_AGENT_TIMEOUT_SEC",
        "attempts": "DRESSAGE_AGENT_ATTEMPTS",
        "max_turns": "DRESSAGE_AGENT_MAX_TURNS",
        "partial_rollout": "DRESSAGE_AGENT_PARTIAL_ROLLOUT",
    }
    SECRETS: ClassVar[frozenset[str]] = frozenset({"admin_key", "api_key"})
    WHAT: ClassVar[str] = "agent dispatch settings"

    proxy_url: str | None = None
    admin_key: str | None = None
    api_key: str | None = None
    agent: str = Field(
        "tool_user",
        description="Agent the black-box rollout runs: a built-in name, module.attribute, or "
        "'cmd: COMMAND'.",
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest one agent attempt may run (black-box rollout) before it is stopped.",
    )
    attempts: int = Field(
        2,
        gt=0,
        description="Attempts per sample (black-box rollout); each retry discards the failed "
        "session.",
    )
    max_turns: int = Field(
        4, gt=0, description="Model calls one agent run may make (black-box rollout)."
    )
    partial_rollout: bool = Field(
        False,
        description="Ask the proxy to keep black-box agent calls' partial output across "
        "weight-update pauses (slime's --partial-rollout turns it on too).",
    )

    @classmethod
    def from_args(cls, args: Any) -> Self:
        """slime's ``args`` over the variables over the defaults (see the module docstring).

        Raises:
            SettingsError: no proxy URL, or a value that does not validate (named with its
                attribute or variable).
        """
        given: dict[str, Any] = {field: getattr(args, attr, None) for field, attr in ARGS.items()}
        if any(_on(getattr(args, attr, None)) for attr in _PARTIAL_ROLLOUT_ARGS):
            given["partial_rollout"] = True
        as_args = {field: f"args.{attr}" for field, attr in ARGS.items()}
        settings = cls.layered(given, given_as=as_args)
        if not settings.proxy_url:
            raise SettingsError(
                "the black-box rollout needs the proxy: set args.dressage_proxy_url or "
                "DRESSAGE_PROXY_URL"
            )
        return settings


def _on(value: Any) -> bool:
    """A YAML string or a hand-set attribute reads as its words; anything else as its truth."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


declare_variables(
    AgentDispatchSettings, ("agent", "timeout_s", "attempts", "max_turns", "partial_rollout")
)
