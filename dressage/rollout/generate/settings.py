"""What the black-box dispatch reads from slime's ``args``, the environment and each sample.

Read once per call into :class:`DispatchSettings` (a frozen dataclass), first found wins
(partial rollout: any source that is on turns it on); the layering and the variables' defaults
are :class:`dressage.config.agent_dispatch.AgentDispatchSettings`'s:

=========================  ===================================  =================================
setting                    ``args`` attribute                   environment (default)
=========================  ===================================  =================================
proxy URL                  ``dressage_proxy_url``               ``DRESSAGE_PROXY_URL`` (required)
admin key (session API)    ``dressage_proxy_admin_key``         ``DRESSAGE_PROXY_ADMIN_KEY``
API key (chat calls)       ``dressage_proxy_api_key``           ``DRESSAGE_PROXY_API_KEY``
agent                      ``dressage_agent``                   ``DRESSAGE_AGENT`` (tool_user)
timeout per attempt (s)    ``dressage_agent_timeout``           ``DRESSAGE_AGENT_TIMEOUT_SEC`` (600)
attempts                   ``dressage_agent_attempts``          ``DRESSAGE_AGENT_ATTEMPTS`` (2)
turns per run              ``dressage_agent_max_turns``         ``DRESSAGE_AGENT_MAX_TURNS`` (4)
partial rollout            ``partial_rollout`` (slime's         ``DRESSAGE_AGENT_PARTIAL_ROLLOUT``
                           ``--partial-rollout``) or            (0)
                           ``dressage_partial_rollout``
=========================  ===================================  =================================

slime puts the keys of ``--custom-config-path run.yaml`` on ``args``, so a run sets them there.
With partial rollout on, the dispatch asks the proxy to keep each agent call's partial output
across weight-update pauses, even when the proxy-wide ``--dressage-partial-rollout`` is off
(:mod:`~dressage.rollout.generate.blackbox_dispatch` says how).

A sample's ``metadata`` may override ``agent``, ``max_turns`` and ``compact_after`` (a dataset
row's ``metadata`` lands there). An agent is named by one of (:func:`parse_agent_spec`)::

    tool_user | compacting                      a built-in agent (dressage.agents)
    my_pkg.agents.run                           an async function (client, task) -> AgentResult
    cmd: my-agent --base-url {base_url}         a command (see dressage.rollout.generate.runners)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dressage.config.agent_dispatch import AgentDispatchSettings

__all__ = [
    "AgentSpec",
    "DispatchSettings",
    "agent_sampling",
    "dispatch_settings",
    "parse_agent_spec",
]

COMMAND_PREFIX = "cmd:"


@dataclass(frozen=True)
class AgentSpec:
    """An agent: a Python function (built-in name or dotted path) or a command template."""

    kind: Literal["python", "command"]
    target: str
    """The dotted path or built-in name; the command template for ``command``."""

    def __str__(self) -> str:
        return f"{COMMAND_PREFIX} {self.target}" if self.kind == "command" else self.target


def parse_agent_spec(text: str) -> AgentSpec:
    """``tool_user``, ``pkg.module.fn`` or ``cmd: COMMAND`` (see the module docstring).

    Raises:
        ValueError: empty, or neither a built-in name, a dotted path nor a ``cmd:`` command.
    """
    from dressage.agents.registry import BUILTIN_AGENTS, is_dotted_path

    spec = text.strip()
    if spec.startswith(COMMAND_PREFIX):
        command = spec[len(COMMAND_PREFIX) :].strip()
        if not command:
            raise ValueError(f"agent {text!r}: 'cmd:' needs a command")
        return AgentSpec("command", command)
    if spec in BUILTIN_AGENTS or is_dotted_path(spec):
        return AgentSpec("python", spec)
    raise ValueError(
        f"agent {text!r} is not a built-in agent {sorted(BUILTIN_AGENTS)}, a dotted "
        "module.attribute path, or 'cmd: COMMAND'"
    )


@dataclass(frozen=True)
class DispatchSettings:
    proxy_url: str
    admin_key: str | None
    api_key: str | None
    agent: AgentSpec
    timeout_s: float
    attempts: int
    max_turns: int
    retry_delay_s: float = 0.5
    partial_rollout: bool = False
    """The agent's calls keep their partial output across rollout pauses (see the docstring)."""


def dispatch_settings(args: Any) -> DispatchSettings:
    """The run-level settings (the sample-level overrides are applied by the dispatch), layered
    by :class:`~dressage.config.agent_dispatch.AgentDispatchSettings`.

    Raises:
        ValueError: no proxy URL, an unparsable agent, or a value that does not validate.
    """
    settings = AgentDispatchSettings.from_args(args)
    assert settings.proxy_url is not None  # from_args refuses a run without one
    return DispatchSettings(
        proxy_url=settings.proxy_url.rstrip("/"),
        admin_key=settings.admin_key,
        api_key=settings.api_key,
        agent=parse_agent_spec(settings.agent),
        timeout_s=settings.timeout_s,
        attempts=settings.attempts,
        max_turns=settings.max_turns,
        partial_rollout=settings.partial_rollout,
    )


def agent_sampling(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """slime's SGLang sampling params as chat request fields (per model call).

    ``max_new_tokens`` -> ``max_tokens``, ``sampling_seed`` -> ``seed``, ``min_new_tokens`` ->
    ``min_tokens``; ``temperature``, ``top_p``, ``top_k`` (when on), ``stop`` and
    ``stop_token_ids`` (when set) keep their names. Detokenizer options (``skip_special_tokens``,
    ``no_stop_trim``, ...) have no chat equivalent and are dropped.
    """
    renamed = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}
    renamed["min_new_tokens"] = "min_tokens"
    out: dict[str, Any] = {}
    for key, value in sampling_params.items():
        if value is None:
            continue
        if key in renamed:
            out[renamed[key]] = value
        elif key in ("temperature", "top_p"):
            out[key] = value
        elif key == "top_k" and int(value) > 0:
            out[key] = int(value)
        elif key in ("stop", "stop_token_ids") and value:
            out[key] = value
    return out
