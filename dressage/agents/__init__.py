"""Built-in agents and the small environments they work in (the embedded default's work).

An agent is ``async def run(client: openai.AsyncOpenAI, task: AgentTask) -> AgentResult``
(:mod:`dressage.agents.base`); the rollout runs it against a proxy session
(``dressage.rollout.generate.blackbox_dispatch``). Built in: ``tool_user`` (a tool loop over a
calculator or a lookup table, :mod:`dressage.agents.tools`) and ``compacting`` (the same loop,
summarising its history every K turns). Run one as a command::

    echo '{"prompt": "Compute 2 + 3.", "task": "calculator"}' | \\
        OPENAI_BASE_URL=http://127.0.0.1:8000/sessions/s1/v1 python -m dressage.agents tool_user
"""

from dressage.agents.base import DEFAULT_SYSTEM_PROMPT, Agent, AgentResult, AgentTask
from dressage.agents.registry import BUILTIN_AGENTS, load_agent
from dressage.agents.tools import ToolEnvironment, environment_for

__all__ = [
    "BUILTIN_AGENTS",
    "DEFAULT_SYSTEM_PROMPT",
    "Agent",
    "AgentResult",
    "AgentTask",
    "ToolEnvironment",
    "environment_for",
    "load_agent",
]
