"""TITO (token in, token out): drift-free incremental tokenization for the recording proxy.

Re-tokenizing a whole conversation every turn can change the ids of text already sent, so the
recorded log-probs and loss masks stop matching the tokens. TITO never re-encodes a prefix: a
segment's ids are the first prompt, then for each turn the ids the engine sampled, verbatim, and
the encoded delta of what the next request appends::

    from dressage.assets import load_tokenizer
    from dressage.proxy.tito.tito_tokenizer import create_tito_tokenizer, SegmentBoundary

    tito = create_tito_tokenizer(load_tokenizer("qwen3.5"), model_type="qwen3.5")
    turn = tito.start(messages, tools=tools)                 # prompt ids: turn.state.ids
    parsed = tito.parse_output(turn.state, output_ids)       # engine output -> assistant message
    state = tito.record_output(turn.state, output_ids, assistant_message=parsed.to_message())
    step = tito.extend(state, messages + [parsed.to_message(), tool_result])
    if isinstance(step, SegmentBoundary):                     # append-only violated
        step = tito.start(messages_of_the_request)            # new segment, rendered whole

Families: ``qwen3.5`` (main), ``qwen3``, ``llama3``, ``deepseek``, each over its pinned template
in ``templates/``; ``generic`` for any chat template; ``build_mode="snapshot"`` for the
re-tokenize-everything baseline. A family with a dot is also accepted with an underscore
(``qwen3_5``, the spelling of slime's and transformers' ``model_type``):
:func:`canonical_model_type` maps every accepted spelling (``MODEL_TYPE_SPELLINGS``) to its
canonical name (``MODEL_TYPES``), which is what configs and records carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from dressage.config.tito_families import MODEL_TYPE_SPELLINGS, MODEL_TYPES, canonical_model_type
from dressage.proxy.tito.base import TITOTokenizer
from dressage.proxy.tito.formats import FORMATS
from dressage.proxy.tito.generic import GenericTITOTokenizer
from dressage.proxy.tito.snapshot import SnapshotTITOTokenizer
from dressage.proxy.tito.state import (
    BoundaryReason,
    SegmentBoundary,
    TITOInputError,
    TITOState,
    TITOTurn,
)
from dressage.proxy.tito.templated import TemplateTITOTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "MODEL_TYPES",
    "MODEL_TYPE_SPELLINGS",
    "BoundaryReason",
    "BuildMode",
    "DeepSeekTITOTokenizer",
    "GenericTITOTokenizer",
    "Llama3TITOTokenizer",
    "Qwen3TITOTokenizer",
    "Qwen35TITOTokenizer",
    "SegmentBoundary",
    "SnapshotTITOTokenizer",
    "TITOInputError",
    "TITOState",
    "TITOTokenizer",
    "TITOTurn",
    "TemplateTITOTokenizer",
    "canonical_model_type",
    "create_tito_tokenizer",
]

BuildMode = Literal["tito", "snapshot"]


class Qwen35TITOTokenizer(TemplateTITOTokenizer):
    """Qwen3.5: ``<|im_start|>``/``<|im_end|>`` turns, XML tool calls, ``<think>`` reasoning."""

    chat_format = FORMATS["qwen3.5"]


class Qwen3TITOTokenizer(TemplateTITOTokenizer):
    """Qwen3: the Qwen3.5 turns with JSON tool calls."""

    chat_format = FORMATS["qwen3"]


class Llama3TITOTokenizer(TemplateTITOTokenizer):
    """Llama 3: header-token turns closed by ``<|eot_id|>``, JSON tool calls, ``ipython`` turns."""

    chat_format = FORMATS["llama3"]


class DeepSeekTITOTokenizer(TemplateTITOTokenizer):
    """DeepSeek V3.1 style: ``<｜User｜>``/``<｜Assistant｜>`` turns, tool-call token blocks."""

    chat_format = FORMATS["deepseek"]


_FAMILIES: dict[str, type[TemplateTITOTokenizer]] = {
    "qwen3.5": Qwen35TITOTokenizer,
    "qwen3": Qwen3TITOTokenizer,
    "llama3": Llama3TITOTokenizer,
    "deepseek": DeepSeekTITOTokenizer,
}
if MODEL_TYPES != (*_FAMILIES, "generic"):  # the names are configuration's vocabulary
    raise ImportError(f"TITO families {[*_FAMILIES, 'generic']} != {list(MODEL_TYPES)}")


def create_tito_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    model_type: str = "qwen3.5",
    *,
    build_mode: BuildMode = "tito",
    chat_template: str | None = None,
    parser: str | None = None,
) -> TITOTokenizer:
    """The TITO tokenizer for ``model_type`` (any spelling of ``MODEL_TYPE_SPELLINGS``) over
    ``tokenizer``.

    ``chat_template`` and ``parser`` (an output-parser family) apply to ``generic`` only, which
    otherwise uses the tokenizer's own template and returns outputs as plain content.
    """
    model_type = canonical_model_type(model_type)
    inner: TITOTokenizer
    if model_type == "generic":
        inner = GenericTITOTokenizer(tokenizer, chat_template=chat_template, parser=parser)
    else:
        if chat_template is not None or parser is not None:
            raise ValueError(
                f"model_type {model_type!r} renders with its pinned template and parser; "
                "chat_template and parser are for model_type='generic'"
            )
        inner = _FAMILIES[model_type](tokenizer)
    if build_mode == "snapshot":
        return SnapshotTITOTokenizer(inner)
    if build_mode != "tito":
        raise ValueError(f"unknown build_mode {build_mode!r}; expected 'tito' or 'snapshot'")
    return inner
