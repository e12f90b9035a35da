"""Agent clients share one TLS context: building a client no longer loads the certificate store
(27 ms of CPU each; a rollout builds one per agent run)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest

from dressage.agents.client import agent_client
from dressage.proxy.client import ProxyClient, SyncProxyClient
from dressage.tls import tls_context

pytestmark = pytest.mark.unit


def test_clients_reuse_the_process_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(agent_client("http://127.0.0.1:9/v1", api_key="k", timeout_s=5).close())
    made: list[ssl.SSLContext] = []  # counted from here: the libraries' import-time ones are made
    create = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(create(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    tls_context.cache_clear()
    try:

        async def build() -> None:
            for k in range(3):
                client = agent_client(
                    "http://127.0.0.1:9/v1", api_key="k", timeout_s=5, headers={"x-run": str(k)}
                )
                assert client.max_retries == 0 and client.default_headers["x-run"] == str(k)
                await client.close()
            await ProxyClient("http://127.0.0.1:9").aclose()

        asyncio.run(build())
        SyncProxyClient("http://127.0.0.1:9").close()
        assert len(made) == 1 and tls_context() is made[0]
    finally:
        tls_context.cache_clear()
