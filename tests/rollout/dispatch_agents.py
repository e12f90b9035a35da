"""Agents that misbehave on purpose, for the black-box dispatch tests (named by dotted path)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from dressage.agents.base import AgentResult, AgentTask
from dressage.agents.tool_user import ask, run

ATTEMPTS: Counter[str] = Counter()
"""Attempts per prompt, for the flaky agent."""


async def slow(client: Any, task: AgentTask) -> AgentResult:
    """One model call, then hangs."""
    await ask(client, task, task.initial_messages(), [])
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def broken(client: Any, task: AgentTask) -> AgentResult:
    """One model call, then its tool server dies."""
    await ask(client, task, task.initial_messages(), [])
    raise RuntimeError("the tool server exploded")


async def silent(client: Any, task: AgentTask) -> AgentResult:
    """Answers without asking the model: nothing for the proxy to record."""
    return AgentResult(final_answer="42", turns=0)


async def flaky(client: Any, task: AgentTask) -> AgentResult:
    """Fails its first attempt on a prompt (after a recorded call), then works."""
    ATTEMPTS[task.prompt_text] += 1
    if ATTEMPTS[task.prompt_text] == 1:
        await ask(client, task, task.initial_messages(), [])
        raise ConnectionError("lost the sandbox")
    return await run(client, task)


def not_async(client: Any, task: AgentTask) -> AgentResult:
    return AgentResult(final_answer="", turns=0)
