"""Constrained decoding for the embedded engine: SGLang's ``json_schema``, ``regex``, ``ebnf``
and ``structural_tag`` sampling parameters, compiled with xgrammar (SGLang's default grammar
backend) on the CPU.

    grammars = Grammars(tokenizer, vocab_size=V, stop_token_ids=eos)
    compiled = grammars.compile("json_schema", '{"type": "object"}')   # GrammarError if bad
    matcher = grammars.matcher(compiled)
    mask = matcher.next_mask()        # int32 words, bit j of word i: token 32 i + j allowed
    matcher.accept(token)

Each step the request's matcher fills the mask of the tokens the grammar allows next; the
sampler sets every other logit to -inf before the softmax (:mod:`~dressage.engine.sampling`),
so the sampled token and its log-prob come from the masked, renormalised distribution, as in
SGLang, where the vocabulary mask is applied to the logits before its sampler. Once the
grammar is complete only the stop tokens are allowed. Compiled grammars are cached by their
text (xgrammar's compiler cache), so a session that sends the same schema compiles it once.
A ``json_schema`` is compiled without free whitespace between tokens (SGLang's
``--constrained-json-disable-any-whitespace``): a small model otherwise loops on blanks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["GRAMMAR_KEYS", "GrammarError", "GrammarMatcher", "Grammars"]

GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


class GrammarError(ValueError):
    """A constraint the grammar library cannot compile; the message says which part."""


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._matcher = matcher
        self._mask = xgr.allocate_token_bitmask(1, vocab_size)

    def next_mask(self) -> torch.Tensor:
        self._matcher.fill_next_token_bitmask(self._mask)
        return self._mask[0].clone()

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class Grammars:
    """The compiler of one engine's vocabulary (built on first use: ~1 s for 248k tokens)."""

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stops = sorted(stop_token_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stops
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
            return self._compiler

    def compile(self, kind: str, value: str) -> Any:
        """``kind`` is one of :data:`GRAMMAR_KEYS`; raises :class:`GrammarError`."""
        compiler = self._get_compiler()
        try:
            if kind == "json_schema":
                return compiler.compile_json_schema(value, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(value)
            if kind == "ebnf":
                return compiler.compile_grammar(value)
            return compiler.compile_structural_tag(value)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(
                f"sampling_params.{kind} cannot be compiled: {_reason(exc)}"
            ) from None

    def matcher(self, compiled: Any) -> GrammarMatcher:
        import xgrammar as xgr

        return GrammarMatcher(xgr.GrammarMatcher(compiled), self.vocab_size)


def _reason(exc: Exception) -> str:
    """xgrammar's message without its C++ source location (``[time] file.cc:123: ``)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("[") and ": " in text:
        text = text.split(": ", 1)[1]
    return text[:500]
