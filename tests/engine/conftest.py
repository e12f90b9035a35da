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

    # Control routes open (the loopback opt-out): the bad-input tests post malformed control
    # bodies, which a key would stop before they are read (test_engine_auth covers keys).
    with serve_engine(
        tiny_model_path,
        device="cpu",
        num_threads=1,
        context_length=CONTEXT,
        max_body_bytes=MAX_BODY,
        open_control_routes=True,
    ) as url:
        yield url


@pytest.fixture(scope="session")
def reference_model(tiny_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
