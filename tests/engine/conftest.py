"""Shared fixtures for the engine tests: one real engine per worker for read-only tests, and a
reference transformers model for full-forward checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.engine_oracle import CONTEXT, MAX_BODY


@pytest.fixture(scope="session")
def engine_url(tiny_model_path: Path) -> Iterator[str]:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path,
        device="cpu",
        num_threads=1,
        context_length=CONTEXT,
        max_body_bytes=MAX_BODY,
    ) as url:
        yield url


@pytest.fixture(scope="session")
def reference_model(tiny_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
