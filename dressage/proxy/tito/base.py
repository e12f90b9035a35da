"""The interface every TITO tokenizer implements, and what they all share.

``start`` renders a segment's first request whole; ``extend`` appends one request's new messages
to a segment (or says why it cannot); ``record_output`` appends the sampled ids verbatim.
Implementations: one per pinned chat family (:mod:`~dressage.proxy.tito.templated`), the generic
prefix-checking mode (:mod:`~dressage.proxy.tito.generic`) and the snapshot baseline
(:mod:`~dressage.proxy.tito.snapshot`).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, cast

from dressage.proxy.parsers import ParsedOutput, parse_assistant_output
from dressage.proxy.tito.history import AppendOk, check_append
from dressage.proxy.tito.state import (
    BoundaryReason,
    SegmentBoundary,
    TITOInputError,
    TITOState,
    TITOTurn,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dressage.proxy.tito.tiktoken_encode import TiktokenEncoder

__all__ = [
    "Encoder",
    "SwitchingDecoder",
    "SwitchingEncoder",
    "TITOTokenizer",
    "make_decoder",
    "make_encoder",
    "retry_pending",
    "single_token_id",
]

Encoder = Callable[[str], list[int]]
log = logging.getLogger(__name__)


def make_encoder(tokenizer: PreTrainedTokenizerBase) -> Encoder:
    """``tokenizer.encode(text, add_special_tokens=False)``: through tiktoken when the tokenizer is
    one it reproduces (:mod:`~dressage.proxy.tito.tiktoken_encode`), else through the Rust
    backend when there is one (same ids, without transformers' per-call Python overhead)."""
    from tokenizers import Tokenizer

    from dressage.proxy.tito.tiktoken_encode import known_tiktoken_encoder

    known, fast = known_tiktoken_encoder(tokenizer)
    if fast is not None:
        return cast(Encoder, fast)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        slow: Encoder = lambda text: backend.encode(text, add_special_tokens=False).ids  # noqa: E731
    else:
        slow = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    return slow if known else SwitchingEncoder(tokenizer, slow)


class SwitchingEncoder:
    """The backend's encoder until tiktoken's is built for the tokenizer (a few seconds, in a
    thread, so that nothing waits for it at start), then tiktoken's: both give the same ids
    (:mod:`~dressage.proxy.tito.tiktoken_encode`), so a call may take either."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, slow: Encoder) -> None:
        self.encode: Encoder = slow
        self.built = threading.Event()
        threading.Thread(
            target=self._build, args=(tokenizer,), name="tiktoken-encoder", daemon=True
        ).start()

    def _build(self, tokenizer: PreTrainedTokenizerBase) -> None:
        from dressage.proxy.tito.tiktoken_encode import tiktoken_encoder

        try:
            fast = tiktoken_encoder(tokenizer)
            if fast is not None:
                self.encode = fast
        except Exception:  # the backend's encoder stays: same ids, slower
            log.exception("building the tiktoken encoder failed; the backend's encoder stays")
        finally:
            self.built.set()

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)


def make_decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)``:
    through tiktoken where the tokenizer's tiktoken encoder decodes as its backend does
    (:meth:`~dressage.proxy.tito.tiktoken_encode.TiktokenEncoder.decode`, 3-9x faster), else
    through the Rust backend when the tokenizer is transformers' plain fast tokenizer (its
    ``decode`` then calls exactly that, after per-call Python overhead); a tokenizer class
    that overrides decoding keeps its own."""
    from dressage.proxy.tito.tiktoken_encode import known_tiktoken_encoder

    slow, plain = _backend_decoder(tokenizer)
    if not plain:  # the class decodes its own way: tiktoken would not give its text
        return slow
    known, fast = known_tiktoken_encoder(tokenizer)
    if known:
        return _tiktoken_decoder(fast, slow)
    return SwitchingDecoder(tokenizer, slow)


def _backend_decoder(
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[Callable[[list[int]], str], bool]:
    """The tokenizer's decode, and whether it is the Rust backend's plain ``decode``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    backend = getattr(tokenizer, "backend_tokenizer", None)
    cls = type(tokenizer)
    if (
        isinstance(backend, Tokenizer)
        and isinstance(tokenizer, TokenizersBackend)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is TokenizersBackend._decode
    ):
        return lambda ids: str(backend.decode(ids, skip_special_tokens=False)), True
    return lambda ids: str(
        tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ), False


def _tiktoken_decoder(
    fast: TiktokenEncoder | None, slow: Callable[[list[int]], str]
) -> Callable[[list[int]], str]:
    """``fast``'s decode where it decodes as the backend (``slow``) does, else ``slow``; an id
    tiktoken does not hold goes to ``slow``, which skips it (or refuses it) as it always did."""
    if fast is None or not fast.decodes:
        return slow
    tiktoken_decode = fast.decode

    def decode(ids: list[int]) -> str:
        try:
            return tiktoken_decode(ids)
        except (KeyError, OverflowError, TypeError, ValueError):
            return slow(ids)

    return decode


class SwitchingDecoder:
    """The backend's decoder until the tokenizer's tiktoken encoder is known (its build runs in
    :class:`SwitchingEncoder`'s thread), then :func:`_tiktoken_decoder`'s: both give the same
    text, so a call may take either."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, slow: Callable[[list[int]], str]):
        self._tokenizer = tokenizer
        self._slow = slow
        self.decode: Callable[[list[int]], str] = self._until_known

    def __call__(self, ids: list[int]) -> str:
        return self.decode(ids)

    def _until_known(self, ids: list[int]) -> str:
        from dressage.proxy.tito.tiktoken_encode import known_tiktoken_encoder

        known, fast = known_tiktoken_encoder(self._tokenizer)
        if not known:
            return self._slow(ids)
        self.decode = _tiktoken_decoder(fast, self._slow)
        return self.decode(ids)


def single_token_id(encode: Encoder, token: str, family: str) -> int:
    ids = encode(token)
    if len(ids) != 1:
        raise ValueError(
            f"the tokenizer has no single token {token!r} (it encodes to {ids}): "
            f"it is not a {family} vocabulary"
        )
    return ids[0]


class TITOTokenizer(ABC):
    """Token in, token out: a segment's ids grow by appended deltas and sampled outputs only."""

    family: str
    stop_token_ids: list[int]
    """Ids the engine should stop on."""
    closer_ids: frozenset[int]
    """Ids that close an assistant turn when sampled last."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.encode: Encoder = make_encoder(tokenizer)
        self._decode = make_decoder(tokenizer)

    @abstractmethod
    def start(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> TITOTurn:
        """First request of a segment: render the conversation whole, with a generation prompt.

        Raises :class:`TITOInputError` when no segment can hold the request.
        """

    def extend(
        self,
        state: TITOState,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> TITOTurn | SegmentBoundary:
        """Append the request's new messages (its FULL list must start with the segment's).

        On success ``state`` is updated in place and returned in the turn; on a boundary it is
        left untouched. Raises :class:`TITOInputError` for input no segment can hold.

        Every mode starts the same way: the append-only check (:func:`check_append`), then, while
        the segment's last generation has no recorded output, only a plain retry goes on
        (:func:`retry_pending`). What the new messages append is the mode's :meth:`_append`.
        """
        kwargs = dict(chat_template_kwargs or {})
        check = check_append(
            state, messages, tools, kwargs, prompt_only_kwargs=self.prompt_only_kwargs
        )
        if isinstance(check, SegmentBoundary):
            return check
        if state.awaiting_output:
            return retry_pending(state, messages, check.first_new, check.echo_updates, kwargs)
        return self._append(state, messages, check, tools=tools, kwargs=kwargs)

    @abstractmethod
    def _append(
        self,
        state: TITOState,
        messages: Sequence[dict[str, Any]],
        check: AppendOk,
        *,
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> TITOTurn | SegmentBoundary:
        """``extend`` past its shared start: append ``messages[check.first_new:]`` to a segment
        whose last output is recorded (same contract as :meth:`extend`)."""

    @property
    def prompt_only_kwargs(self) -> Collection[str]:
        """Template kwargs that shape only the generation prompt: changing one between calls
        keeps the segment (none unless the mode's chat format names some)."""
        return frozenset()

    @abstractmethod
    def render_conversation(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The whole conversation as text, as ``start`` and the snapshot mode render it."""

    def thinking(self, chat_template_kwargs: dict[str, Any]) -> bool | None:
        """Whether the generation prompt opens a reasoning block (None: unknown, or none)."""
        return None

    @property
    def parser_family(self) -> str | None:
        return None

    def record_output(
        self, state: TITOState, output_ids: Sequence[int], *, assistant_message: dict[str, Any]
    ) -> TITOState:
        """Append the sampled ids verbatim (mask 1) and remember the message returned to the agent.

        An output that does not end in a turn closer (a length stop, an abort) leaves the turn open;
        the next ``extend`` closes it with a non-trainable closer.
        """
        if not state.awaiting_output:
            raise ValueError(
                "record_output: the segment ends in an output already; call extend() first"
            )
        if not isinstance(assistant_message, dict) or assistant_message.get("role") != "assistant":
            raise TITOInputError(
                f"record_output: assistant_message must be an assistant message, "
                f"got {assistant_message!r:.120}"
            )
        ids = list(output_ids)
        state.ids.extend(ids)
        state.loss_mask.extend([1] * len(ids))
        state.messages.append(assistant_message)
        state.echoes.append(assistant_message)
        state.sampled.append(True)
        state.open_turn = not ids or ids[-1] not in self.closer_ids
        state.awaiting_output = False
        self._after_output(state, ids)
        return state

    def _after_output(self, state: TITOState, output_ids: list[int]) -> None:  # noqa: B027
        """Hook for modes that track more than ids (the generic mode tracks text)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (what a parser reads)."""
        return self._decode(list(ids))

    def parse_output(self, state: TITOState, output_ids: Sequence[int]) -> ParsedOutput:
        """The assistant message for ``output_ids`` sampled after ``state``'s generation prompt."""
        text = self.decode(output_ids)
        family = self.parser_family
        if family is None:
            return ParsedOutput(content=text)
        return parse_assistant_output(
            text,
            family=family,
            tools=state.tools,
            thinking=self.thinking(state.chat_template_kwargs),
        )

    @staticmethod
    def _new_state(
        messages: Sequence[dict[str, Any]],
        ids: list[int],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        text: str | None = None,
    ) -> TITOState:
        return TITOState(
            ids=ids,
            loss_mask=[0] * len(ids),
            messages=list(messages),
            echoes=list(messages),
            sampled=[False] * len(messages),
            tools=tools,
            chat_template_kwargs=kwargs,
            text=text,
        )

    @staticmethod
    def _commit(
        state: TITOState,
        messages: Sequence[dict[str, Any]],
        first_new: int,
        echo_updates: list[tuple[int, dict[str, Any]]],
        delta: list[int],
        kwargs: dict[str, Any],
    ) -> TITOTurn:
        for i, message in echo_updates:
            state.echoes[i] = message
        appended = list(messages[first_new:])
        state.ids.extend(delta)
        state.loss_mask.extend([0] * len(delta))
        state.messages.extend(appended)
        state.echoes.extend(appended)
        state.sampled.extend([False] * len(appended))
        state.chat_template_kwargs = kwargs
        state.awaiting_output = True
        state.open_turn = False
        return TITOTurn(delta_ids=delta, state=state)


def retry_pending(
    state: TITOState,
    messages: Sequence[dict[str, Any]],
    first: int,
    echo_updates: list[tuple[int, dict[str, Any]]],
    kwargs: dict[str, Any],
) -> TITOTurn | SegmentBoundary:
    """A request while the last generation has no output: only a plain retry can go on
    (the same messages again: nothing to append)."""
    if first == len(messages) and kwargs == state.chat_template_kwargs:
        for i, message in echo_updates:
            state.echoes[i] = message
        return TITOTurn(delta_ids=[], state=state)
    return SegmentBoundary(
        BoundaryReason.OUTPUT_NOT_RECORDED,
        f"{len(messages) - first} new messages (or new template kwargs) arrived, but the "
        "segment's last generation prompt has no recorded output",
        first,
    )
