from __future__ import annotations

from typing import Any

import pytest

from dressage.assets import load_tokenizer
from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer


@pytest.fixture(scope="session")
def qwen35_tokenizer() -> Any:
    return load_tokenizer("qwen3.5")


@pytest.fixture
def qwen35(qwen35_tokenizer: Any) -> TITOTokenizer:
    return create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
