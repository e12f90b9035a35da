"""TITO: token-in/token-out tokenization for the recording proxy (see ``tito_tokenizer``)."""

from dressage.proxy.tito.template_utils import load_pinned_template
from dressage.proxy.tito.tito_tokenizer import (
    MODEL_TYPES,
    BoundaryReason,
    SegmentBoundary,
    TITOInputError,
    TITOState,
    TITOTokenizer,
    TITOTurn,
    create_tito_tokenizer,
)

__all__ = [
    "MODEL_TYPES",
    "BoundaryReason",
    "SegmentBoundary",
    "TITOInputError",
    "TITOState",
    "TITOTokenizer",
    "TITOTurn",
    "create_tito_tokenizer",
    "load_pinned_template",
]
