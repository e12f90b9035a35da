"""Run an agent as a command, the way a black-box agent runs: against ``$OPENAI_BASE_URL``.

    echo '{"prompt": "Compute 2 + 3.", "task": "calculator"}' | \\
        OPENAI_BASE_URL=http://127.0.0.1:8000/sessions/s1/v1 OPENAI_API_KEY=key \\
        python -m dressage.agents tool_user

    python -m dressage.agents compacting --prompt "Compute 2 + 3." --task calculator

The task is read from stdin as JSON (:class:`~dressage.agents.base.AgentTask` fields, or a bare
JSON string as the prompt) unless ``--prompt`` is given. The result is printed to stdout as one
JSON line (``final_answer``, ``turns``, ``tool_calls``, ...), which is what the rollout's command
runner reads. Exit status 0 on a result, 1 when the agent failed (the error on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence

from dressage.agents.base import AgentResult, AgentTask
from dressage.agents.registry import BUILTIN_AGENTS, load_agent
from dressage.commands import command_parser

__all__ = ["main"]


def _task(args: argparse.Namespace) -> AgentTask:
    if args.prompt is not None:
        return AgentTask(prompt=args.prompt, task=args.task, max_turns=args.max_turns or 4)
    task = AgentTask.from_json(sys.stdin.read())
    if args.max_turns is not None:
        task = dataclasses.replace(task, max_turns=args.max_turns)
    if args.task is not None:
        task = dataclasses.replace(task, task=args.task)
    return task


async def _run(agent_name: str, task: AgentTask) -> AgentResult:
    from openai import AsyncOpenAI

    agent = load_agent(agent_name)
    # The SDK reads OPENAI_BASE_URL itself; a proxy without API keys still needs a non-empty one.
    key = os.environ.get("OPENAI_API_KEY")
    client = AsyncOpenAI(api_key=key or "unused", max_retries=0)
    try:
        return await agent(client, task)
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m dressage.agents", description=__doc__)
    parser.add_argument("agent", help=f"built-in {sorted(BUILTIN_AGENTS)} or module.attribute")
    parser.add_argument("--prompt", help="the task prompt (default: a JSON task on stdin)")
    parser.add_argument("--task", help="task name: picks the tools (calculator, lookup)")
    parser.add_argument(
        "--max-turns", type=int, help="model calls allowed (default: the task's, 4)"
    )
    args = parser.parse_args(argv)
    if not os.environ.get("OPENAI_BASE_URL"):
        print("error: OPENAI_BASE_URL is not set (the proxy session's base URL)", file=sys.stderr)
        return 1
    try:
        result = asyncio.run(_run(args.agent, _task(args)))
    except Exception as exc:  # a process boundary: the error becomes the exit status
        print(f"error: agent {args.agent!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(result.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
