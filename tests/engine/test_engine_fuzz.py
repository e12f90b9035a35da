"""Schema fuzzing of the embedded engine: cases generated from its OpenAPI document, ``/generate``
included, and none may get a 5xx (issue 15: "no 500 from any input").

The real engine over the tiny model, in process (its ASGI app through schemathesis' test
client, lifespan and all), with a 32-token context so that every accepted generation is a few
milliseconds. Two control routes are left out, each for a reason that is not input handling:
``/pause_generation`` holds every later ``/generate`` until a ``/continue_generation`` (its body
is fuzzed through the same parser as the others), and ``/update_weights_from_disk`` loads a
checkpoint (its refusals are in test_engine_weights.py). The admin key is set, and sent, so the
control routes are reached whether or not they need a key. ``FUZZ_REPORT`` names a file that
gets the figures, ``DRESSAGE_FUZZ_SCALE`` multiplies the example counts (tests/helpers.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.python import asgi

from tests.fuzzing import fuzz_operation
from tests.helpers import fuzz_examples, fuzz_floor, report_fuzz

pytestmark = pytest.mark.integration

ADMIN = "fuzz-admin-key"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
SKIPPED = {"/pause_generation", "/update_weights_from_disk"}
GENERATE_EXAMPLES = 250  # per method (POST, PUT) and generation mode
OTHER_EXAMPLES = 25


@pytest.fixture
def app(tiny_model_path: Path) -> Iterator[Any]:
    from dressage.engine.config import EngineConfig
    from dressage.engine.server import create_app

    config = EngineConfig(
        model_path=str(tiny_model_path),
        device="cpu",
        num_threads=1,
        context_length=32,
        admin_api_key=ADMIN,
    )
    application = create_app(config)
    try:
        yield application
    finally:
        asgi.shutdown_lifespans()  # stops the engine thread the fuzzer's client started


def test_no_fuzzed_request_gets_a_5xx(app: Any) -> None:
    # the document is not a data route, so it wants the control key like any other path
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
    operations = [r.ok() for r in schema.get_all_operations()]
    operations = [op for op in operations if op.path not in SKIPPED]
    assert "/generate" in {op.path for op in operations}
    started = time.perf_counter()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    for operation in operations:
        examples = fuzz_examples(
            GENERATE_EXAMPLES if operation.path == "/generate" else OTHER_EXAMPLES
        )
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(
                operation,
                mode,
                examples,
                statuses,
                failures,
                headers=AUTH,
            )
    report_fuzz("engine", statuses, time.perf_counter() - started)
    assert not failures, "\n".join(failures[:10])
    assert sum(statuses.values()) >= fuzz_floor(1000), statuses
    assert statuses[200] >= fuzz_floor(20), statuses  # it reached the model, not only the checks
