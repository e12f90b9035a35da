"""Run one agent attempt against one proxy session: a Python coroutine or a subprocess.

Both end in an :class:`~dressage.agents.base.AgentResult` or raise :class:`AgentFailure`
(``kind`` says what went wrong: ``timeout``, ``agent_error``, ``bad_output``); the dispatch
decides what a failure means for the sample.

Python agents run as coroutines on the rollout's event loop with the async OpenAI SDK pointed
at the session (``base_url`` = the session's URL, ``max_retries=0``: the dispatch retries with a
fresh session instead, and ``headers`` as the client's default headers on every call: the
dispatch's ``X-Dressage-Partial-Rollout: 1``), so many samples' agents run concurrently in one
process.

Commands run as asyncio subprocesses, in their own process group (a timeout kills the group,
children included). The command contract:

* the template is run by ``/bin/sh``; the placeholders ``{base_url}``, ``{session_id}`` and
  ``{prompt}`` are replaced by the shell-quoted values (no other brace is touched);
* the environment adds ``OPENAI_BASE_URL`` (the session's URL) and ``OPENAI_API_KEY`` (the
  proxy's API key, else ``unused``), so an unmodified OpenAI client talks to the session;
* stdin carries the task as one JSON object (``AgentTask`` fields: ``prompt``, ``task``,
  ``sampling``, ``max_turns``, ...);
* the final answer is the ``final_answer`` of the last stdout line when that line is a JSON
  object (what ``python -m dressage.agents`` prints), else the whole of stdout, stripped;
* exit status 0 is success; anything else fails the attempt (the stderr tail is the reason).

A command's own HTTP client cannot be given headers: whatever the dispatch must tell the proxy
about its calls it sets on the session instead (``ProxyClient.open_session``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dressage.agents.base import AgentResult, AgentTask
from dressage.agents.client import agent_client
from dressage.agents.registry import load_agent

if TYPE_CHECKING:
    from dressage.rollout.generate.settings import AgentSpec

__all__ = ["AgentFailure", "run_agent", "run_command_agent", "run_python_agent"]

STDERR_TAIL = 800


class AgentFailure(RuntimeError):
    """One attempt failed; ``kind`` is ``timeout``, ``agent_error`` or ``bad_output``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


async def run_python_agent(
    path: str,
    task: AgentTask,
    *,
    base_url: str,
    api_key: str | None,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> AgentResult:
    agent = load_agent(path)
    client = agent_client(
        base_url, api_key=api_key or "unused", timeout_s=timeout_s, headers=headers
    )
    try:
        result = await asyncio.wait_for(agent(client, task), timeout_s)
    except TimeoutError:
        raise AgentFailure("timeout", f"agent {path} ran longer than {timeout_s:g} s") from None
    except Exception as exc:  # the agent is a black box: whatever it raises fails the attempt
        raise AgentFailure("agent_error", f"agent {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        await client.close()
    if not isinstance(result, AgentResult):
        raise AgentFailure("bad_output", f"agent {path} returned {type(result).__name__}")
    return result


def _final_answer(stdout: str) -> AgentResult:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if lines:
        try:
            data = json.loads(lines[-1])
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and "final_answer" in data:
            known = set(AgentResult.__dataclass_fields__)
            fields = {"turns": 0, **{k: v for k, v in data.items() if k in known}}
            return AgentResult(**fields)
    return AgentResult(final_answer=stdout.strip(), turns=0)


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def run_command_agent(
    template: str,
    task: AgentTask,
    *,
    base_url: str,
    session_id: str,
    api_key: str | None,
    timeout_s: float,
) -> AgentResult:
    command = template
    for name, value in (
        ("base_url", base_url),
        ("session_id", session_id),
        ("prompt", task.prompt_text),
    ):  # only these exact placeholders: other braces (inline scripts) are left alone
        command = command.replace("{" + name + "}", shlex.quote(value))
    env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key or "unused")
    process = await asyncio.create_subprocess_shell(
        command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group: a timeout kills its children too
    )
    try:
        stdout, stderr = await asyncio.wait_for(
            process.communicate(task.to_json().encode()), timeout_s
        )
    except TimeoutError:
        await _kill_group(process)
        raise AgentFailure(
            "timeout", f"command {template!r} ran longer than {timeout_s:g} s"
        ) from None
    except BaseException:  # cancelled: never leave the agent running
        await _kill_group(process)
        raise
    if process.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-STDERR_TAIL:]
        raise AgentFailure(
            "agent_error", f"command {template!r} exited with {process.returncode}: {tail}"
        )
    return _final_answer(stdout.decode(errors="replace"))


async def run_agent(
    spec: AgentSpec,
    task: AgentTask,
    *,
    base_url: str,
    session_id: str,
    api_key: str | None,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> AgentResult:
    """One attempt of ``spec`` on ``task`` in the session at ``base_url``; ``headers`` go on
    every call of a Python agent (a command's calls cannot carry them: see the docstring)."""
    if spec.kind == "command":
        return await run_command_agent(
            spec.target,
            task,
            base_url=base_url,
            session_id=session_id,
            api_key=api_key,
            timeout_s=timeout_s,
        )
    return await run_python_agent(
        spec.target, task, base_url=base_url, api_key=api_key, timeout_s=timeout_s, headers=headers
    )
