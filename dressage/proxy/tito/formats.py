"""The chat families TITO renders with pinned templates, and what it must know beyond them.

A template renders turns; TITO also needs the token that closes an assistant turn (added when an
output stopped without it), the text the template writes after that closer, the tokens the engine
stops on, and which ``chat_template_kwargs`` only shape the generation prompt (those may change from
turn to turn without rewriting history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMATS", "ChatFormat", "chat_format"]


@dataclass(frozen=True)
class ChatFormat:
    family: str
    template: str
    """Pinned template name (``templates/<template>.jinja``)."""
    turn_closer: str
    after_closer: str
    closer_tokens: tuple[str, ...]
    """Tokens that close an assistant turn when they are the last sampled token."""
    stop_tokens: tuple[str, ...]
    parser: str
    """Family name in :data:`dressage.proxy.parsers.PARSERS`."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """``chat_template_kwargs`` defaults, as the template applies them."""
    prompt_only_kwargs: frozenset[str] = frozenset()
    """Kwargs that only shape the generation prompt, so they may change between turns."""

    def thinking(self, kwargs: dict[str, Any]) -> bool | None:
        """Whether the generation prompt opens a reasoning block (None: the family has none)."""
        if "enable_thinking" not in self.defaults:
            return None
        enabled = bool(kwargs.get("enable_thinking", self.defaults["enable_thinking"]))
        # Qwen3 opens <think> itself when thinking is on; its prompt says nothing about it.
        if self.family == "qwen3" and enabled:
            return None
        return enabled


FORMATS: dict[str, ChatFormat] = {
    "qwen3.5": ChatFormat(
        family="qwen3.5",
        template="qwen3_5_fixed",
        turn_closer="<|im_end|>",
        after_closer="\n",
        closer_tokens=("<|im_end|>",),
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        parser="qwen3.5",
        defaults={"enable_thinking": True},
        prompt_only_kwargs=frozenset({"enable_thinking"}),
    ),
    "qwen3": ChatFormat(
        family="qwen3",
        template="qwen3_fixed",
        turn_closer="<|im_end|>",
        after_closer="\n",
        closer_tokens=("<|im_end|>",),
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        parser="qwen3",
        defaults={"enable_thinking": True},
        prompt_only_kwargs=frozenset({"enable_thinking"}),
    ),
    "llama3": ChatFormat(
        family="llama3",
        template="llama3_fixed",
        turn_closer="<|eot_id|>",
        after_closer="",
        closer_tokens=("<|eot_id|>", "<|eom_id|>"),
        stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        parser="llama3",
    ),
    "deepseek": ChatFormat(
        family="deepseek",
        template="deepseek_v3_fixed",
        turn_closer="<｜end▁of▁sentence｜>",
        after_closer="",
        closer_tokens=("<｜end▁of▁sentence｜>",),
        stop_tokens=("<｜end▁of▁sentence｜>",),
        parser="deepseek",
        defaults={"enable_thinking": False},
        prompt_only_kwargs=frozenset({"enable_thinking"}),
    ),
}


def chat_format(family: str) -> ChatFormat:
    try:
        return FORMATS[family]
    except KeyError:
        raise ValueError(f"unknown chat family {family!r}; known: {sorted(FORMATS)}") from None
