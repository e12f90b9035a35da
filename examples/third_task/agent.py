"""An agent as a Python function: one chat call through the OpenAI SDK, no tools.

A dataset row names it in ``metadata.agent`` (``third_task.agent.run``); the dispatch calls it with
an ``openai.AsyncOpenAI`` client already pointed at the row's proxy session, so every token the
model produces for it is recorded.
"""

from __future__ import annotations

from openai import AsyncOpenAI

from dressage.agents.base import AgentResult, AgentTask

SYSTEM_PROMPT = "You are a careful assistant. Reply with the final answer only."


async def run(client: AsyncOpenAI, task: AgentTask) -> AgentResult:
    """Ask once and answer with what the model said."""
    reply = await client.chat.completions.create(
        messages=task.initial_messages(SYSTEM_PROMPT),  # type: ignore[arg-type]
        **task.request_options(),
    )
    choice = reply.choices[0]
    return AgentResult(
        final_answer=(choice.message.content or "").strip(),
        turns=1,
        stop_reason="length" if choice.finish_reason == "length" else "answer",
    )
