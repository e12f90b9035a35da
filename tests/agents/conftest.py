"""Fixtures of the agent tests: the proxy's Qwen3.5 TITO tokenizer and scripted replies."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer


@pytest.fixture(scope="session")
def tito(qwen35_tokenizer: Any) -> TITOTokenizer:
    return create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")


def tool_call(name: str, **arguments: str) -> str:
    """What the model writes (thinking off) to call ``name``, through the turn closer."""
    parameters = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call><|im_end|>"


def answer(text: str) -> str:
    return f"{text}<|im_end|>"
