"""The longest-token scan behind the untokenized refusal runs off the event loop (issue 31, bad
input): a hostile client's first oversized message must not stall every other session while
250k vocabulary entries are measured.

The engine and the tokenizer are small fakes with only what :class:`InputLimits` calls
(``server_info``; ``get_vocab``), so the test sees which thread scans and can hold the scan
while it checks that the loop still runs.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from dressage.proxy.errors import BadRequest
from dressage.proxy.limits import InputLimits


class _Engine:
    async def server_info(self) -> dict[str, Any]:
        return {"context_length": 64, "max_req_input_len": 48}


class _HeldVocabulary:
    """``get_vocab`` records its thread and waits for ``release``."""

    def __init__(self) -> None:
        self.thread: int | None = None
        self.started = threading.Event()
        self.release = threading.Event()

    def get_vocab(self) -> dict[str, int]:
        self.thread = threading.get_ident()
        self.started.set()
        assert self.release.wait(10), "the test never released the scan"
        return {"a": 0, "abcd": 1, "ab": 2}


def test_the_vocabulary_is_scanned_in_a_thread_while_the_loop_runs() -> None:
    vocabulary = _HeldVocabulary()
    limits = InputLimits(cast(Any, _Engine()), cast(Any, vocabulary))

    async def scenario() -> None:
        learning = asyncio.create_task(limits.context())
        for _ in range(5000):
            if vocabulary.started.is_set() or learning.done():
                break
            await asyncio.sleep(0.001)
        assert vocabulary.started.is_set(), "learning the context did not scan the vocabulary"
        ticks = 0
        for _ in range(20):  # the loop keeps running while the scan is held
            await asyncio.sleep(0)
            ticks += 1
        assert not learning.done()
        vocabulary.release.set()
        context = await learning
        assert context is not None and context.max_input == 48
        assert ticks == 20
        assert vocabulary.thread != threading.get_ident()
        assert limits.max_token_chars == 4  # kept: no second scan
        with pytest.raises(BadRequest, match="no token covers more than 4 characters"):
            limits.refuse_impossible(48 * 4 + 1, context, "chat")
        limits.refuse_impossible(48 * 4, context, "chat")

    asyncio.run(scenario())
