"""TITO: token-in/token-out tokenization for the recording proxy (see ``tito_tokenizer``)."""

from dressage.proxy.tito.template_utils import load_pinned_template
from dressage.proxy.tito.tito_tokenizer import (
    MODEL_TYPE_SPELLINGS,
    MODEL_TYPES,
    BoundaryReason,
    DeepSeekTITOTokenizer,
    GenericTITOTokenizer,
    Llama3TITOTokenizer,
    Qwen3TITOTokenizer,
    Qwen35TITOTokenizer,
    SegmentBoundary,
    SnapshotTITOTokenizer,
    TemplateTITOTokenizer,
    TITOInputError,
    TITOState,
    TITOTokenizer,
    TITOTurn,
    canonical_model_type,
    create_tito_tokenizer,
)

__all__ = [
    "MODEL_TYPES",
    "MODEL_TYPE_SPELLINGS",
    "BoundaryReason",
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
    "load_pinned_template",
]
