"""The compacting agent: the tool loop, with its history rewritten every K turns.

    from dressage.agents.compacting import run
    result = await run(client, AgentTask(prompt=..., task="calculator", compact_after=2))

Long-horizon agents keep their context short by summarising: after ``task.compact_after`` model
calls the conversation is replaced by the original request plus one user message listing what
the tools returned so far. The new message list no longer extends what the proxy rendered, so
the proxy closes the segment and opens a new one: a run of N turns leaves about
``ceil(N / K)`` segments, which train as sibling samples of one trajectory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dressage.agents.base import AgentResult, AgentTask
from dressage.agents.tool_user import tool_loop

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["MAX_NOTES", "compact", "run"]

MAX_NOTES = 8
"""Tool results kept in a summary (the latest ones)."""


def compact(
    task: AgentTask, messages: list[dict[str, Any]], notes: list[str]
) -> list[dict[str, Any]]:
    """The request (every message before the first assistant turn) plus a progress summary."""
    head = []
    for message in messages:
        if message.get("role") == "assistant":
            break
        head.append(message)
    kept = notes[-MAX_NOTES:]
    lines = "\n".join(f"- {note}" for note in kept) if kept else "- no tool results yet"
    summary = (
        "Progress so far (earlier turns, summarised):\n"
        f"{lines}\n"
        "Continue from here and reply with the final answer only."
    )
    return [*head, {"role": "user", "content": summary}]


async def run(client: AsyncOpenAI, task: AgentTask) -> AgentResult:
    """The agent: :func:`~dressage.agents.tool_user.tool_loop` with :func:`compact`."""
    return await tool_loop(client, task, compactor=compact)
