"""How much a call may bring and ask for: the engine's context, learned from the engine.

    limits = InputLimits(engine, tito.tokenizer)
    context = await limits.context()                  # EngineContext, or None (not known yet)
    limits.refuse_impossible(chars, context, where)   # before tokenizing: 400 if it cannot fit
    limits.refuse_too_long(prompt_tokens, context, where)
    max_new = default_budget(default_max_tokens, prompt_tokens, context)

The context comes from the engine's ``GET /server_info`` (SGLang's and the embedded engine's:
``context_length``, ``max_req_input_len``), asked once and kept; while the engine cannot say, the
checks wait (the engine still refuses what does not fit).

An input that cannot fit is refused before it is tokenized at all: no token of the tokenizer
decodes to more than ``max_token_chars`` characters (its longest vocabulary entry, 128 for the
Qwen3.5 vocabulary), so a prompt holding ``c`` characters of message text has at least
``c / max_token_chars`` tokens. A 10 MB message in front of a 32k-token engine is a 400 in
microseconds instead of seconds of tokenizing. What passes that bound is tokenized (off the
event loop when it is large, see :mod:`~dressage.proxy.sessions`) and checked exactly.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from dressage.proxy.engine_answers import EngineError
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.errors import BadRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["EngineContext", "InputLimits", "default_budget", "input_chars", "longest_token"]

log = logging.getLogger(__name__)
_RETRY_S = 30.0
"""How long to go without limits after the engine could not say them."""


@dataclass(frozen=True)
class EngineContext:
    """The engine's token limits."""

    length: int
    """Prompt plus output, in tokens."""
    max_input: int
    """Longest prompt the engine takes (SGLang's ``max_req_input_len``)."""


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else None


def parse_server_info(info: dict[str, Any]) -> EngineContext | None:
    """The limits in a ``/server_info`` answer, or None when it has neither."""
    length, max_input = _as_int(info.get("context_length")), _as_int(info.get("max_req_input_len"))
    if length is None and max_input is None:
        return None
    if length is None:
        assert max_input is not None
        length = max_input + 1
    return EngineContext(length=length, max_input=max_input or length - 1)


def input_chars(messages: Sequence[Any]) -> int:
    """Characters of text in the messages (content, reasoning, tool-call arguments): a lower
    bound of what the rendered prompt holds."""
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        for key in ("content", "reasoning_content"):
            value = message.get(key)
            if isinstance(value, str):
                total += len(value)
            elif isinstance(value, list):
                total += sum(
                    len(part["text"])
                    for part in value
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                total += len(arguments)
    return total


def default_budget(default: int, prompt_tokens: int, context: EngineContext | None) -> int:
    """``max_new_tokens`` for a call that sets none: the proxy's default, within the context."""
    if context is None:
        return default
    return max(1, min(default, context.length - prompt_tokens))


_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """Characters of the tokenizer's longest vocabulary entry (at least 1), kept per tokenizer."""
    try:
        found = _LONGEST.get(tokenizer)
    except TypeError:  # not weakly referable: measured each time
        found = None
    if found is None:
        found = max(max(map(len, tokenizer.get_vocab()), default=1), 1)
        try:
            _LONGEST[tokenizer] = found
        except TypeError:
            pass
    return found


class InputLimits:
    """The engine's context (asked once) and the checks against it (module docstring)."""

    def __init__(self, engine: EngineClient, tokenizer: PreTrainedTokenizerBase) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._context: EngineContext | None = None
        self._retry_at = 0.0
        self._lock = asyncio.Lock()
        self._max_token_chars: int | None = None
        self._scan: asyncio.Future[int] | None = None

    async def context(self) -> EngineContext | None:
        if self._context is not None or time.monotonic() < self._retry_at:
            return self._context
        async with self._lock:
            if self._context is None and time.monotonic() >= self._retry_at:
                try:
                    self._context = parse_server_info(await self._engine.server_info())
                except (EngineError, httpx.HTTPError, ValueError) as exc:
                    log.warning("engine limits unknown (/server_info: %s)", exc)
                if self._context is not None and self._max_token_chars is None:
                    self._max_token_chars = await self.scan()  # before any check needs it
                if self._context is None:
                    self._retry_at = time.monotonic() + _RETRY_S
        return self._context

    def scan(self) -> asyncio.Future[int]:
        """The longest token's length, measured once in a worker thread (~0.2 s for 250k
        entries, once per tokenizer in a process). The app starts it when it starts, so that
        neither the first call nor a hostile client's first oversized message waits for it."""
        if self._scan is None:
            self._scan = asyncio.ensure_future(asyncio.to_thread(longest_token, self._tokenizer))
        return self._scan

    @property
    def max_token_chars(self) -> int:
        """Characters of the longest token: known once the engine's context is (:meth:`scan`),
        else measured here on first use."""
        if self._max_token_chars is None:
            self._max_token_chars = longest_token(self._tokenizer)
        return self._max_token_chars

    def refuse_impossible(self, chars: int, context: EngineContext | None, where: str) -> None:
        """400 when ``chars`` characters of text cannot fit the context in any tokenization."""
        if context is None or chars <= context.max_input:  # fits whatever max_token_chars is
            return
        bound = context.max_input * self.max_token_chars
        if chars > bound:
            raise BadRequest(
                f"{where}: the messages hold {chars} characters of text, more than any prompt "
                f"of at most {context.max_input} tokens (the engine's context is "
                f"{context.length}) can hold: no token covers more than "
                f"{self.max_token_chars} characters, so {bound} characters is the most that "
                "could fit. Nothing was tokenized.",
                param="messages",
                code="context_length_exceeded",
            )

    def refuse_too_long(
        self, prompt_tokens: int, context: EngineContext | None, where: str
    ) -> None:
        """400 when the tokenized prompt is longer than the engine takes."""
        if context is not None and prompt_tokens > context.max_input:
            raise BadRequest(
                f"{where}: the prompt is {prompt_tokens} tokens; the engine takes at most "
                f"{context.max_input} (its context is {context.length} tokens)",
                param="messages",
                code="context_length_exceeded",
            )
