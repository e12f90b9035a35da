"""The agent protocol: an async function of an OpenAI client and a task, returning a result.

    async def run(client: openai.AsyncOpenAI, task: AgentTask) -> AgentResult

The client points at one proxy session (its base URL is the session's), so everything the agent
asks the model is recorded; the agent never sees tokens. :class:`AgentTask` carries what the
rollout knows about the sample: the prompt (text or chat messages), the task name that picks the
tool environment, the sampling parameters as OpenAI request fields, and the turn budget. It
crosses a process boundary as JSON for agents run as commands (``python -m dressage.agents``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "Agent",
    "AgentResult",
    "AgentTask",
    "StopReason",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant. Use a tool when one helps, then reply with the final answer only."
)

StopReason = Literal["answer", "max_turns", "length"]

# OpenAI request fields an agent passes as keyword arguments; anything else in ``sampling``
# (SGLang extras the proxy understands, such as top_k) goes in the request's extra body.
OPENAI_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop"})


@dataclass(frozen=True)
class AgentTask:
    """One sample's work for an agent.

    Attributes:
        prompt: the sample's prompt: text (sent as the user message after the agent's system
            prompt) or a list of chat messages (sent as they are).
        task: the task name (``calculator``, ``lookup``, ...): picks the tool environment.
        sampling: request fields: ``max_tokens``, ``temperature``, ``top_p``, ``seed``,
            ``stop`` and proxy extras (``top_k``, ``stop_token_ids``).
        max_turns: model calls the agent may make.
        compact_after: turns between history compactions (agents that compact).
        chat_template_kwargs: passed to the proxy's chat template (thinking off by default:
            the tiny models of the embedded default never close a reasoning block).
        metadata: the sample's metadata (JSON-safe values), e.g. a lookup ``table``.
    """

    prompt: str | list[dict[str, Any]]
    task: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    compact_after: int = 2
    chat_template_kwargs: dict[str, Any] = field(default_factory=lambda: {"enable_thinking": False})
    metadata: dict[str, Any] = field(default_factory=dict)
    model: str = "dressage"

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.compact_after < 1:
            raise ValueError(f"compact_after must be >= 1, got {self.compact_after}")

    @property
    def prompt_text(self) -> str:
        """The prompt as text: the last user message of a message list."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m.get("content") for m in self.prompt if m.get("role") == "user"]
        return str(users[-1]) if users and users[-1] is not None else ""

    def initial_messages(self, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[dict[str, Any]]:
        """What the first request sends: ``[system, user]``, or the given message list."""
        if isinstance(self.prompt, str):
            return [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": self.prompt},
            ]
        return [dict(m) for m in self.prompt]

    def request_options(self) -> dict[str, Any]:
        """Keyword arguments for ``client.chat.completions.create`` besides messages/tools."""
        options: dict[str, Any] = {"model": self.model}
        extra: dict[str, Any] = {"chat_template_kwargs": dict(self.chat_template_kwargs)}
        for key, value in self.sampling.items():
            (options if key in OPENAI_FIELDS else extra)[key] = value
        options["extra_body"] = extra
        return options

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> AgentTask:
        data = json.loads(text)
        if isinstance(data, str):  # a bare prompt
            return cls(prompt=data)
        if not isinstance(data, dict) or "prompt" not in data:
            raise ValueError("an agent task is a JSON object with a 'prompt' (or a JSON string)")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown agent task fields {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass
class AgentResult:
    """What an agent ends with.

    Attributes:
        final_answer: the text the reward reads (the last assistant content).
        turns: model calls made.
        tool_calls: tool calls executed (``tool_errors`` of them returned an error).
        compactions: history rewrites (each opens a new segment at the proxy).
        stop_reason: ``answer`` (a reply without tool calls), ``max_turns`` or ``length``.
    """

    final_answer: str
    turns: int
    tool_calls: int = 0
    tool_errors: int = 0
    compactions: int = 0
    stop_reason: StopReason = "answer"

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


Agent = Callable[["AsyncOpenAI", AgentTask], Awaitable[AgentResult]]
"""``async def run(client, task) -> AgentResult``."""
