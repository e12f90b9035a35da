"""The OpenAI client an in-process agent is handed, one per agent run.

    client = agent_client(base_url, api_key=key, timeout_s=60.0)   # an openai.AsyncOpenAI

Each run gets its own client (an agent may close it; sessions do not share connections); all of
them share the process's TLS context (:func:`dressage.tls.tls_context`), which is what made a
client expensive to build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openai import AsyncOpenAI

from dressage.tls import tls_context

__all__ = ["agent_client"]


def agent_client(
    base_url: str,
    *,
    api_key: str,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` for one agent run: no retries (a failed call fails the attempt, which
    the rollout retries as a whole), ``timeout_s`` per request, the shared TLS context."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    return AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=timeout_s,
        default_headers=headers,
        http_client=DefaultAsyncHttpxClient(verify=tls_context(), timeout=timeout_s),
    )
