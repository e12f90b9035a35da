"""Whether the engine serves the proxy's vocabulary, checked once the engine answers.

    check = VocabularyCheck(engine, tokenizer, tokenizer_name="the project's qwen3.5 tokenizer")
    await check.first_look()          # at start: decides now if the engine already answers
    await check.watch(on_mismatch)    # then: polls until it answers, decides once
    await check.verified()            # before a call: raises VocabularyMismatch (503) naming both

Why: without ``--tokenizer-path`` the proxy takes its family's own tokenizer (Qwen3.5's 248,077
ids). In front of an engine serving another vocabulary (the 704-token tiny teachers) every call
would fail at the engine (its stop ids lie outside the vocabulary), or the other way round the
engine would sample ids the proxy cannot read. The proxy refuses instead, naming both sides.

The engine's vocabulary is ``vocab_size`` in its ``/server_info`` (the embedded engine's), else in
the ``config.json`` of the folder its ``/model_info`` names as ``model_path`` (SGLang's answers
carry no vocabulary size, but name the checkpoint, which a proxy beside slime sees on the same
filesystem; a multimodal config's ``text_config`` counts). When neither says, the check is
skipped with one warning: it cannot refuse what it cannot see.

The rule: each of the tokenizer's ``N`` ids must be a row of the engine's ``V``-row embedding
(``N <= V``), and the engine may have more rows only as padding, at most
``max(1024, N // 64)`` (Qwen3.5: 248,077 ids in 248,320 rows; Qwen3: 151,669 in 151,936;
DeepSeek-V3: 128,815 in 129,280; the tiny task vocabulary: 690 in 704).

When: the proxy does not wait for its engine to start (on a cluster it starts before slime's
engines; the embedded services start both at once). At start it looks once (a few seconds at
most): an engine that answers is checked there, and ``dressage-proxy`` refuses to start on a
mismatch (the sentence on stderr, exit status 2, no ready line). Otherwise it polls the engine's
``/health`` every :data:`POLL_S` seconds and checks the first time it answers; a mismatch then
stops ``dressage-proxy`` the same way. A chat call that comes first checks before it generates.
Until a check has passed every chat call is refused by a mismatch it finds (503, the sentence);
``/ready`` says so too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from dressage.config.proxy import ProxyConfig
from dressage.proxy.engine_answers import EngineError
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.errors import VocabularyMismatch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "POLL_S",
    "EngineVocabulary",
    "VocabularyCheck",
    "engine_vocabulary",
    "mismatch",
    "tokenizer_name",
    "tokenizer_size",
]

log = logging.getLogger(__name__)
POLL_S = 2.0
"""Seconds between two looks at an engine that does not answer yet."""
_PADDING_MIN = 1024


@dataclass(frozen=True)
class EngineVocabulary:
    """What the engine says it serves."""

    size: int | None
    """Rows of its embedding, or None when it does not say."""
    model_path: str
    tokenizer_path: str
    source: str
    """Where ``size`` was read (``/server_info``, a config.json), or why it is unknown."""


def tokenizer_name(config: ProxyConfig) -> str:
    """How a refusal names the proxy's tokenizer."""
    if config.tokenizer_path:
        return config.tokenizer_path
    return (
        f"the project's {config.tito_model} tokenizer (the default of --tito-model "
        f"{config.tito_model}: no --tokenizer-path was given)"
    )


def _size(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _config_vocab(model_path: str) -> int | None:
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    return _size(config.get("vocab_size")) or (
        _size(text.get("vocab_size")) if isinstance(text, dict) else None
    )


def engine_vocabulary(model_info: dict[str, Any], server_info: dict[str, Any]) -> EngineVocabulary:
    """The engine's vocabulary from its ``/model_info`` and ``/server_info`` answers (and the
    checkpoint's config.json when the proxy can read it; module docstring)."""
    model_path = str(model_info.get("model_path") or server_info.get("model_path") or "")
    tokenizer_path = str(model_info.get("tokenizer_path") or model_path)
    size, source = _size(server_info.get("vocab_size")), "/server_info"
    if size is None and model_path:
        size, source = _config_vocab(model_path), f"{model_path}/config.json"
    if size is None:
        source = "neither /server_info nor a readable config.json of model_path says"
    return EngineVocabulary(size, model_path, tokenizer_path, source)


def tokenizer_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """Ids the tokenizer can produce: ``[0, N)``."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def mismatch(ids: int, engine: EngineVocabulary, *, tokenizer_name: str, url: str) -> str | None:
    """The sentence that refuses this pairing, or None when the engine serves ``ids`` ids."""
    rows = engine.size
    if rows is None or ids <= rows <= ids + max(_PADDING_MIN, ids // 64):
        return None
    served = engine.model_path or "its model"
    if engine.tokenizer_path and engine.tokenizer_path != engine.model_path:
        served += f" (tokenizer {engine.tokenizer_path})"
    fix = f"--tokenizer-path {engine.tokenizer_path}".rstrip()
    return (
        f"The proxy's tokenizer, {tokenizer_name}, has {ids} token ids, but the engine at {url} "
        f"serves {served} with a vocabulary of {rows} rows: start the proxy with {fix} "
        "(the engine's tokenizer) or point it at an engine that serves this tokenizer's model."
    )


class VocabularyCheck:
    """The proxy's tokenizer against its engine, decided once (module docstring)."""

    def __init__(
        self, engine: EngineClient, tokenizer: PreTrainedTokenizerBase, *, tokenizer_name: str
    ) -> None:
        self._engine = engine
        self._ids = tokenizer_size(tokenizer)
        self._name = tokenizer_name
        self._lock = asyncio.Lock()
        self.decided = False
        self.refusal: str | None = None
        """The mismatch sentence, once one was found."""

    async def _decide(self) -> bool:
        """Ask the engine and decide; False when it cannot answer yet."""
        async with self._lock:
            if self.decided:
                return True
            try:
                model_info = await self._engine.model_info()
                server_info = await self._engine.server_info()
            except (EngineError, httpx.HTTPError, ValueError) as exc:
                log.debug("vocabulary check: the engine does not answer yet (%s)", exc)
                return False
            vocabulary = engine_vocabulary(model_info, server_info)
            if vocabulary.size is None:
                log.warning(
                    "the proxy's tokenizer (%s, %d ids) was not checked against the engine's "
                    "vocabulary: %s",
                    self._name,
                    self._ids,
                    vocabulary.source,
                )
            self.refusal = mismatch(
                self._ids, vocabulary, tokenizer_name=self._name, url=self._engine.url
            )
            self.decided = True
            if self.refusal:
                log.error("%s", self.refusal)
            return True

    async def first_look(self) -> None:
        """Decide now if the engine answers its ``/health`` (at most a few seconds)."""
        if await self._engine.healthy():
            await self._decide()

    async def watch(self, on_mismatch: Callable[[str], None] | None = None) -> None:
        """Poll until the engine answers, decide once; ``on_mismatch(sentence)`` on a refusal."""
        while not self.decided:
            if not (await self._engine.healthy() and await self._decide()):
                await asyncio.sleep(POLL_S)
        if self.refusal and on_mismatch is not None:
            on_mismatch(self.refusal)

    async def verified(self) -> None:
        """Before a call: raise :class:`VocabularyMismatch` when the engine serves another
        vocabulary; an engine that cannot answer yet is left to the call itself."""
        if not self.decided:
            await self._decide()
        if self.refusal:
            raise VocabularyMismatch(self.refusal)
