"""The tool-using agent: ask the model, run the tools it calls, stop at an answer.

    from dressage.agents.tool_user import run
    result = await run(AsyncOpenAI(base_url=session_url, api_key=key), AgentTask(prompt=...))

Each turn sends the whole conversation with the task's tools (the proxy appends only what is
new). A reply with tool calls gets one ``tool`` message per call (an argument the tool cannot
use comes back as an ``error: ...`` result for the model to read, not as an exception); a reply
without tool calls is the final answer. The loop ends there, or after ``task.max_turns`` calls.
The conversation only ever grows, so a run is one segment at the proxy.

:func:`tool_loop` is the loop itself; the compacting agent reuses it with a history rewrite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dressage.agents.base import DEFAULT_SYSTEM_PROMPT, AgentResult, AgentTask
from dressage.agents.tools import ToolEnvironment, environment_for

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["Compactor", "ask", "run", "tool_loop"]

Compactor = Callable[[AgentTask, list[dict[str, Any]], list[str]], list[dict[str, Any]]]
"""``(task, messages, notes) -> new messages``: rewrites a long history into a short one."""


async def ask(
    client: AsyncOpenAI,
    task: AgentTask,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> tuple[dict[str, Any], str]:
    """One chat call: the assistant message (as it must be echoed back) and its finish reason."""
    options = task.request_options()
    if tools:
        options["tools"] = tools
    response = await client.chat.completions.create(messages=messages, **options)  # type: ignore[arg-type]
    choice = response.choices[0]
    return choice.message.model_dump(exclude_none=True), str(choice.finish_reason)


def _run_calls(
    env: ToolEnvironment, message: dict[str, Any], notes: list[str]
) -> list[dict[str, Any]]:
    results = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        name, arguments = str(function.get("name", "")), function.get("arguments")
        output = env.call(name, arguments)
        notes.append(f"{name}({arguments}) -> {output}")
        results.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": output})
    return results


async def tool_loop(
    client: AsyncOpenAI,
    task: AgentTask,
    *,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    compactor: Compactor | None = None,
) -> AgentResult:
    """Run the task to an answer (see the module docstring).

    With ``compactor``, every ``task.compact_after`` turns the history is replaced by
    ``compactor(task, messages, notes)`` before the next call (``notes``: one line per tool
    call so far).
    """
    env = environment_for(task.task, task.prompt_text, task.metadata)
    messages = task.initial_messages(system_prompt)
    notes: list[str] = []
    result = AgentResult(final_answer="", turns=0)
    since_compaction = 0
    while result.turns < task.max_turns:
        if compactor is not None and since_compaction >= task.compact_after:
            messages = compactor(task, messages, notes)
            result.compactions += 1
            since_compaction = 0
        message, finish = await ask(client, task, messages, env.specs)
        result.turns += 1
        since_compaction += 1
        messages.append(message)
        content = str(message.get("content") or "").strip()
        if content:
            result.final_answer = content
        if not message.get("tool_calls"):
            result.stop_reason = "length" if finish == "length" else "answer"
            break
        messages += _run_calls(env, message, notes)
    else:
        result.stop_reason = "max_turns"
    result.tool_calls, result.tool_errors = env.calls, env.errors
    return result


async def run(client: AsyncOpenAI, task: AgentTask) -> AgentResult:
    """The agent: :func:`tool_loop` without compaction."""
    return await tool_loop(client, task)
