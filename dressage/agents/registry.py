"""Agents by name: the built-in ones, or any ``module.attribute`` async function.

load_agent("tool_user")                    # dressage.agents.tool_user.run
load_agent("my_pkg.agents.search_agent")   # your own: async def (client, task) -> AgentResult
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import cast

from dressage.agents.base import Agent

__all__ = ["BUILTIN_AGENTS", "is_dotted_path", "load_agent"]

BUILTIN_AGENTS: dict[str, str] = {
    "tool_user": "dressage.agents.tool_user.run",
    "compacting": "dressage.agents.compacting.run",
}

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def is_dotted_path(text: str) -> bool:
    return bool(_DOTTED.match(text))


def load_agent(name: str) -> Agent:
    """The agent function of a built-in name or a dotted path (split on the last dot).

    Raises:
        ValueError: not a built-in name, not a dotted path, not importable, or not an async
            function.
    """
    path = BUILTIN_AGENTS.get(name, name)
    if not is_dotted_path(path):
        raise ValueError(
            f"agent {name!r} is neither a built-in agent {sorted(BUILTIN_AGENTS)} nor a dotted "
            "module.attribute path"
        )
    module_name, _, attr = path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"agent {name!r}: cannot import {path}: {exc}") from exc
    if not inspect.iscoroutinefunction(target):
        raise ValueError(f"agent {name!r}: {path} must be an async function (client, task)")
    return cast(Agent, target)
