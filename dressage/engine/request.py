"""One generation request: its prompt, sampling parameters and everything produced so far.

The scheduler thread is the only writer; HTTP handlers read. Lists only grow, and a token's
logprob is appended before the token itself, so a reader that takes ``len(output_ids)`` first
always finds a logprob for each id it sees.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from dressage.engine.sampling import SamplingParams


@dataclass(frozen=True)
class FinishReason:
    """SGLang's ``meta_info.finish_reason`` object."""

    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.status_code,
            "err_type": None,
        }


_MASK64 = (1 << 64) - 1
ABORTED = FinishReason("abort", message="Aborted")
ABORTED_WAITING = FinishReason("abort", message="Abort in waiting queue")


@dataclass(eq=False)
class Request:
    """A request from admission to finish. ``max_new_tokens`` is already resolved (never None)."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    return_logprob: bool = False
    logprob_start_len: int = -1
    stream: bool = False
    created: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    # [version, start, end) spans over output positions: which weights produced which tokens
    weight_spans: list[list[Any]] = field(default_factory=list)
    finish: FinishReason | None = None
    finished_at: float | None = None
    finish_version: str | None = None
    num_retractions: int = 0
    started: bool = False  # prefilled at least once (an abort then counts as "running")
    slot: int = -1
    listener: Any = None  # set by the server; the scheduler passes it back untouched
    grammar: Any = None  # a grammar.GrammarMatcher when the request is constrained
    top_logprobs_num: int = 0
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    seed: int = field(init=False)
    _stop_window: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        seed = self.params.sampling_seed
        self.seed = (seed if seed is not None else random.getrandbits(64)) & _MASK64
        # Decode enough trailing tokens to see any stop string whole (a token is >= 1 byte).
        longest = max((len(s.encode()) for s in self.params.stop), default=0)
        self._stop_window = longest + 2

    @property
    def finished(self) -> bool:
        return self.finish is not None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def all_tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def reserved_tokens(self) -> int:
        """KV positions this request may ever need."""
        return len(self.prompt_ids) + self.max_new_tokens

    def next_uniform(self) -> float:
        """The uniform number that picks output token ``len(output_ids)``: a hash of (seed,
        position), so a seed gives the same tokens whatever the batch, and a step that is redone
        (an interrupted step, a retracted request) draws the same number again."""
        z = (self.seed + (len(self.output_ids) + 1) * 0x9E3779B97F4A7C15) & _MASK64  # splitmix64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return ((z ^ (z >> 31)) >> 11) * 2.0**-53

    def append(
        self, token: int, logprob: float, version: str, top: list[tuple[float, int]] | None = None
    ) -> None:
        position = len(self.output_ids)
        if self.top_logprobs_num > 0:
            self.output_top_logprobs.append(top or [])
        self.output_logprobs.append(logprob)
        self.output_ids.append(token)
        if self.weight_spans and self.weight_spans[-1][0] == version:
            self.weight_spans[-1][2] = position + 1
        else:
            self.weight_spans.append([version, position, position + 1])

    def set_finished(self, reason: FinishReason, version: str) -> None:
        self.finish_version = self.weight_spans[-1][0] if self.weight_spans else version
        self.finished_at = time.monotonic()
        self.finish = reason

    def check_stop(self, eos_ids: frozenset[int], tail_text: Any) -> FinishReason | None:
        """SGLang's order: length first, then a stop/EOS token, then a stop string.

        ``tail_text(ids) -> str`` decodes the last tokens (only called with stop strings).
        """
        if len(self.output_ids) >= self.max_new_tokens:
            return FinishReason("length", length=self.max_new_tokens)
        last = self.output_ids[-1]
        if last in self.params.stop_token_ids or (not self.params.ignore_eos and last in eos_ids):
            return FinishReason("stop", matched=last)
        if self.params.stop:
            tail = tail_text(self.output_ids[-self._stop_window :])
            for stop in self.params.stop:
                if stop in tail:
                    return FinishReason("stop", matched=stop)
        return None
