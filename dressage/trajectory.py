"""What the proxy records: one :class:`StepRecord` per chat call, grouped into :class:`Segment` s.

A session (one agent run against the proxy) is a list of steps. Steps append to the current
segment as long as the conversation stays append-only; a rewrite (compaction, a changed system
prompt or tool list, an assistant message that differs from what was sampled, a render failure)
opens a new segment. A finalized segment is the unit that becomes one slime ``Sample``.

Token layout of a segment, step by step::

    [prompt_delta_0 | output_0 | prompt_delta_1 | output_1 | ...]
     mask 0           mask 1     mask 0           mask 1

``prompt_delta`` holds what TITO appended before generation (the first step's whole prompt, then
tool results, user turns, turn closers and the generation prompt); ``output`` holds the ids the
engine sampled, with their log-probs and the weight version of each token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import cache
from typing import Any

__all__ = ["NO_VERSION", "FinishReason", "Segment", "StepRecord"]

NO_VERSION = -1
"""Weight version of a token the engine did not generate (prompt, tool output, closers)."""


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    SEGMENT_BOUNDARY = "segment_boundary"
    ABORT = "abort"

    @classmethod
    def parse(cls, value: str | FinishReason) -> FinishReason:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"finish_reason {value!r} is not one of: {allowed}") from None


@dataclass
class StepRecord:
    """One proxy call, exactly as the engine saw it."""

    session_id: str
    step_index: int
    segment_index: int
    prefix_length: int
    """Length of the segment's token sequence before this step's delta."""
    prompt_delta_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    messages: list[dict[str, Any]]
    started_at: float
    ended_at: float
    boundary_reason: str | None = None
    """Set on the first step of every segment after the first: why the segment was opened."""
    request_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = f"step {self.session_id}#{self.step_index}"
        n = len(self.output_ids)
        if len(self.output_logprobs) != n or len(self.output_versions) != n:
            raise ValueError(
                f"{where}: output_ids ({n}), output_logprobs ({len(self.output_logprobs)}) and "
                f"output_versions ({len(self.output_versions)}) must have the same length"
            )
        if self.step_index < 0 or self.segment_index < 0 or self.prefix_length < 0:
            raise ValueError(f"{where}: negative step_index, segment_index or prefix_length")
        FinishReason.parse(self.finish_reason)
        logprobs = self.output_logprobs
        if logprobs and max(logprobs) <= 0.0 and math.isfinite(sum(logprobs)):
            return  # in C: a NaN or an infinity makes the sum not finite, then the loop names it
        for i, lp in enumerate(logprobs):
            if not (math.isfinite(lp) and lp <= 0.0):
                raise ValueError(f"{where}: output_logprobs[{i}]={lp!r} is not finite and <= 0")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**_known(cls, data))


@dataclass
class Segment:
    """One append-only stretch of a session: the unit that trains as one slime ``Sample``."""

    session_id: str
    segment_index: int
    tokens: list[int]
    full_loss_mask: list[int]
    full_logprobs: list[float]
    messages: list[dict[str, Any]]
    finish_reason: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    full_versions: list[int] | None = None
    """Weight version per token (``NO_VERSION`` where the engine did not generate it)."""
    prompt_length: int = 0
    """Tokens before the first generated one: the sample's prompt."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = f"segment {self.session_id}#{self.segment_index}"
        n = len(self.tokens)
        lengths = {
            "full_loss_mask": len(self.full_loss_mask),
            "full_logprobs": len(self.full_logprobs),
        }
        if self.full_versions is not None:
            lengths["full_versions"] = len(self.full_versions)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"{where}: tokens has {n} entries but {bad}")
        FinishReason.parse(self.finish_reason)
        if not 0 <= self.prompt_length <= n:
            raise ValueError(f"{where}: prompt_length {self.prompt_length} outside [0, {n}]")
        if not _zeros_and_ones(self.full_loss_mask):
            raise ValueError(f"{where}: full_loss_mask has values other than 0 and 1")
        if any(self.full_loss_mask[: self.prompt_length]):
            raise ValueError(f"{where}: prompt tokens must have loss mask 0")

    @property
    def loss_mask_sum(self) -> int:
        return sum(self.full_loss_mask)

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @classmethod
    def from_steps(
        cls,
        steps: list[StepRecord],
        *,
        messages: list[dict[str, Any]],
        finish_reason: str,
        extra_info: dict[str, Any] | None = None,
        record_versions: bool = True,
    ) -> Segment:
        """Concatenate a segment's steps (in order; all from one session and segment)."""
        if not steps:
            raise ValueError("a segment needs at least one step")
        head = steps[0]
        tokens: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for step in steps:
            if (step.session_id, step.segment_index) != (head.session_id, head.segment_index):
                raise ValueError(
                    f"step {step.session_id}#{step.step_index} belongs to segment "
                    f"{step.segment_index}, not {head.session_id}#{head.segment_index}"
                )
            if step.prefix_length != len(tokens):
                raise ValueError(
                    f"step {step.session_id}#{step.step_index}: prefix_length "
                    f"{step.prefix_length} but the segment has {len(tokens)} tokens before it"
                )
            d, o = len(step.prompt_delta_ids), len(step.output_ids)
            tokens += step.prompt_delta_ids
            tokens += step.output_ids
            mask += [0] * d
            mask += [1] * o
            logprobs += [0.0] * d
            logprobs += step.output_logprobs
            versions += [NO_VERSION] * d
            versions += step.output_versions
        seen = set(versions)
        seen.discard(NO_VERSION)
        distinct = sorted(seen)
        info = {"weight_versions": distinct, **(extra_info or {})}
        return cls(
            session_id=head.session_id,
            segment_index=head.segment_index,
            tokens=tokens,
            full_loss_mask=mask,
            full_logprobs=logprobs,
            messages=messages,
            finish_reason=finish_reason,
            extra_info=info,
            full_versions=versions if record_versions else None,
            prompt_length=len(head.prompt_delta_ids),
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Segment:
        return cls(**_known(cls, data))


def _zeros_and_ones(values: list[Any]) -> bool:
    """Every value equals 0 or 1 (``True`` and ``1.0`` do), in one pass in C."""
    try:
        return set(values) <= {0, 1}
    except TypeError:  # an unhashable value (a list) is neither
        return False


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = _field_names(cls)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
    return {k: v for k, v in data.items() if k in names}
