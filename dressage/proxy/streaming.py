"""Streaming an assistant message as the tokens arrive, consistent with the final parse.

The agent accumulates ``reasoning_content`` and ``content`` deltas into the message it echoes
back on its next call, and TITO compares that echo with the message the proxy recorded (the
family parser's reading of the whole output). So a delta may only be sent once it is certain to
be part of the final parse. :class:`StreamSplitter` holds back what could still change: a tail
that may be the start of ``</think>``, ``<tool_call>``, a turn-end token or a stop string, the pad
newline before ``</think>``, the separator before a tool call; from ``<tool_call>`` on nothing is
streamed (the calls are sent whole at the end). When the stream ends, :meth:`StreamSplitter.finish`
returns what is left to send to reach the recorded message exactly.

Families with a streaming format here: ``qwen3.5`` and ``qwen3``. Others stream nothing until
the output is complete (then the whole message is sent as deltas): their parsers decide on the
whole text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["STREAM_FORMATS", "IncrementalDecoder", "StreamFormat", "StreamSplitter"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamFormat:
    think_open: str
    think_close: str
    pad: str
    """What the format writes inside the think tags (trimmed once at each end)."""
    after_think: str
    tool_open: str
    separator: str
    """What the format writes between text and the first tool call."""
    terminators: tuple[str, ...]


_QWEN_TERMINATORS = ("<|im_end|>", "<|endoftext|>")
STREAM_FORMATS: dict[str, StreamFormat] = {
    "qwen3.5": StreamFormat("<think>", "</think>", "\n", "\n\n", "<tool_call>", "\n\n",
                            _QWEN_TERMINATORS),
    "qwen3": StreamFormat("<think>", "</think>", "\n", "\n\n", "<tool_call>", "\n",
                          _QWEN_TERMINATORS),
}  # fmt: skip


class IncrementalDecoder:
    """Text of a growing list of ids, emitted only where it is complete (no split characters)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        before = self._decode(self._ids[self._prefix : self._read])
        now = self._decode(self._ids[self._prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return now[len(before) :]
        return ""

    def flush(self) -> str:
        """What is still held back (a character split at the very end), decoded as is."""
        before = self._decode(self._ids[self._prefix : self._read])
        now = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return now[len(before) :]


def _partial_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a marker or the start of one."""
    best = 0
    for marker in markers:
        if not marker:
            continue
        if text.endswith(marker):
            best = max(best, len(marker))
            continue
        # a tail that starts the marker starts with its first character: look only there
        i = text.find(marker[0], max(0, len(text) - len(marker) + 1))
        while i >= 0 and len(text) - i > best:
            if marker.startswith(text[i:]):
                best = len(text) - i
                break
            i = text.find(marker[0], i + 1)
    return best


class StreamSplitter:
    """Splits streamed text into safe reasoning / content deltas (see the module docstring)."""

    def __init__(
        self, fmt: StreamFormat | None, *, thinking: bool | None, stops: Sequence[str] = ()
    ) -> None:
        self.fmt = fmt
        self.thinking = thinking
        self._stops = tuple(stops)
        self._text = ""
        self.sent_reasoning = ""
        self.sent_content = ""
        self.diverged = False

    def push(self, text: str) -> dict[str, str]:
        """Add decoded text; returns the deltas now safe to send (``reasoning_content`` and/or
        ``content``), possibly none."""
        self._text += text
        if self.fmt is None or not text:
            return {}
        reasoning, content = self._stable(self._text)
        return self._advance(reasoning, content)

    def finish(self, message: dict[str, Any]) -> dict[str, str]:
        """The deltas that complete the recorded ``message`` (its reasoning and content)."""
        return self._advance(message.get("reasoning_content") or "", message.get("content") or "")

    def _advance(self, reasoning: str, content: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, stable, sent in (
            ("reasoning_content", reasoning, self.sent_reasoning),
            ("content", content, self.sent_content),
        ):
            if len(stable) <= len(sent):
                if not sent.startswith(stable) and not self.diverged:
                    self._diverge(key, sent, stable)
                continue
            if not stable.startswith(sent):
                if not self.diverged:
                    self._diverge(key, sent, stable)
                continue
            out[key] = stable[len(sent) :]
        self.sent_reasoning += out.get("reasoning_content", "")
        self.sent_content += out.get("content", "")
        return out

    def _diverge(self, key: str, sent: str, final: str) -> None:
        self.diverged = True
        log.warning(
            "streamed %s %r is not a prefix of the final %r: the agent's echo will differ",
            key, sent[-80:], final[-80:],
        )  # fmt: skip

    def _stable(self, text: str) -> tuple[str, str]:
        fmt = self.fmt
        assert fmt is not None
        opened = bool(self.thinking)
        body = text
        if text.startswith(fmt.think_open):
            opened, body = True, text[len(fmt.think_open) :]
        elif not opened and fmt.think_open.startswith(text):
            return "", ""  # may still become a reasoning block
        if not opened:
            return "", self._stable_content(text)
        end = body.find(fmt.think_close)
        if end < 0:
            if body.startswith(fmt.pad):
                body = body[len(fmt.pad) :]
            elif fmt.pad.startswith(body):
                return "", ""
            markers = (fmt.think_close, *fmt.terminators)
            keep = len(body) - _partial_suffix(body, markers)
            reasoning = body[:keep]
            if reasoning.endswith(fmt.pad):
                reasoning = reasoning[: -len(fmt.pad)]
            return reasoning, ""
        reasoning = body[:end]
        reasoning = reasoning[len(fmt.pad) :] if reasoning.startswith(fmt.pad) else reasoning
        reasoning = reasoning[: -len(fmt.pad)] if reasoning.endswith(fmt.pad) else reasoning
        rest = body[end + len(fmt.think_close) :]
        if rest.startswith(fmt.after_think):
            rest = rest[len(fmt.after_think) :]
        elif fmt.after_think.startswith(rest):
            return reasoning, ""
        return reasoning, self._stable_content(rest)

    def _stable_content(self, rest: str) -> str:
        fmt = self.fmt
        assert fmt is not None
        start = rest.find(fmt.tool_open)
        if start >= 0:
            return rest[:start].removesuffix(fmt.separator)
        keep = len(rest) - _partial_suffix(rest, (fmt.tool_open, *fmt.terminators, *self._stops))
        head = rest[:keep]
        for k in range(len(fmt.separator), 0, -1):
            if head.endswith(fmt.separator[:k]):
                return head[:-k]
        return head
