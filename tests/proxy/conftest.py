"""Shared fixtures of the proxy tests: the Qwen3.5 TITO tokenizer, scripted engine outputs, a real
embedded engine per test module, and a proxy served on a thread over a fresh store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dressage.config.proxy import ProxyConfig
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.testing import EngineReply, ScriptedEngine, serve_proxy
from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer
from tests.helpers import ENGINE_KEY

TOOL_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


@pytest.fixture(scope="session")
def qwen35_tito(qwen35_tokenizer: Any) -> TITOTokenizer:
    return create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")


@pytest.fixture(scope="module")
def engine_weight_version() -> str:
    """The weight version ``engine_url``'s engine starts at; a module overrides this fixture to
    start at another."""
    return "0"


@pytest.fixture(scope="module")
def engine_url(tiny_model_path: Path, engine_weight_version: str) -> Iterator[str]:
    """A real embedded engine for one test module (its tests may update its weights): CPU, one
    thread, a 4096-token context, the tests' control key."""
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=4096,
        weight_version=engine_weight_version, admin_api_key=ENGINE_KEY,
    ) as url:  # fmt: skip
        yield url


class Script:
    """Scripted engine outputs: texts (encoded with the real tokenizer) or replies, in order;
    the last one repeats. Keeps every ``/generate`` body it answered."""

    def __init__(self, tito: TITOTokenizer, *items: str | EngineReply) -> None:
        self.tito = tito
        self.items = list(items)
        self.bodies: list[dict[str, Any]] = []
        self.replies: list[EngineReply] = []

    def reply(self, text: str, finish: str = "stop") -> EngineReply:
        return EngineReply(self.tito.encode(text), finish=finish)

    def __call__(self, body: dict[str, Any]) -> EngineReply:
        self.bodies.append(body)
        item = self.items.pop(0) if len(self.items) > 1 else self.items[0]
        reply = self.reply(item) if isinstance(item, str) else item
        self.replies.append(reply)
        return reply


@pytest.fixture
def script(qwen35_tito: TITOTokenizer) -> Callable[..., Script]:
    return lambda *items: Script(qwen35_tito, *items)


@contextmanager
def running_proxy(
    engine_url: str,
    store_dir: Path,
    tito: TITOTokenizer,
    *,
    engine: EngineClient | None = None,
    **config: Any,
) -> Iterator[str]:
    """A proxy in front of ``engine_url`` on a fresh thread; yields its URL."""
    cfg = ProxyConfig(engine_url=engine_url, store_dir=store_dir, **config)
    components: dict[str, Any] = {"tito": tito}
    if engine is not None:
        components["engine"] = engine
    with serve_proxy(cfg, **components) as url:
        yield url


@contextmanager
def scripted_proxy(
    script: Script, store_dir: Path, tito: TITOTokenizer, **config: Any
) -> Iterator[tuple[str, ScriptedEngine]]:
    """A scripted engine and a proxy in front of it (``stream_interval_s``, ``incremental``:
    the engine's pace and chunks, see :class:`ScriptedEngine`)."""
    engine = ScriptedEngine(
        script,
        stream_interval_s=config.pop("stream_interval_s", None),
        incremental=config.pop("incremental", False),
    )
    with (
        engine.running() as engine_url,
        running_proxy(
            engine_url, store_dir, tito, engine_retries=config.pop("engine_retries", 0), **config
        ) as url,
    ):
        yield url, engine
