"""Schema fuzzing of the proxy: cases generated from its own OpenAPI document, chat routes
included, and none may get a 5xx (issue 15: "no 500 from any input").

Schemathesis draws valid (positive) and invalid (negative) requests for every operation of
``GET /openapi.json`` and sends them in process (the ASGI app through Starlette's test client)
to a proxy over a scripted engine, so a case costs milliseconds. Settings are derandomized: CI
runs the same cases every time. A pause that a case sets is resumed at once (a paused proxy
holds every later chat call). ``FUZZ_REPORT`` in the environment names a file that gets the
figures (cases, 5xx, seconds) as JSON; ``DRESSAGE_FUZZ_SCALE`` multiplies the example counts
(tests/helpers.fuzz_scale).
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

from dressage.config.proxy import ProxyConfig
from dressage.proxy.server import create_app
from dressage.proxy.testing import EngineReply, ScriptedEngine
from dressage.proxy.tito import TITOTokenizer
from tests.fuzzing import fuzz_operation
from tests.helpers import fuzz_examples, fuzz_floor, report_fuzz
from tests.proxy.conftest import TOOL_CALL

pytestmark = pytest.mark.integration

ANSWERS = ("ok\n</think>\n\nFine.<|im_end|>", f"<think>\n\n</think>\n\n{TOOL_CALL}<|im_end|>")
CHAT_EXAMPLES = 225  # per chat route and generation mode: 900 chat cases
OTHER_EXAMPLES = 20  # per other operation (valid cases: their only inputs are a session id)


class _Rotating:
    """The engine's answers, in turn (text, a tool call, an abort at a chosen token)."""

    def __init__(self, tito: TITOTokenizer) -> None:
        self.replies = [EngineReply(tito.encode(a)) for a in ANSWERS]
        self.replies.append(EngineReply(tito.encode("partial"), finish="abort"))
        self.n = 0

    def __call__(self, body: dict[str, Any]) -> EngineReply:
        self.n += 1
        return self.replies[self.n % len(self.replies)]


@pytest.fixture
def app(tmp_path: Path, qwen35_tito: TITOTokenizer) -> Iterator[Any]:
    engine = ScriptedEngine(_Rotating(qwen35_tito), record=False, context_length=4096)
    with engine.running() as engine_url:
        config = ProxyConfig(engine_url=engine_url, store_dir=tmp_path, engine_retries=0)
        yield create_app(config, tito=qwen35_tito)


def test_no_fuzzed_request_gets_a_5xx(app: Any) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = {op.path + " " + op.method.upper(): op for op in _operations(schema)}
    assert {"/v1/chat/completions POST", "/sessions/{session_id}/v1/chat/completions POST"} <= set(
        operations
    )
    started = time.perf_counter()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    for name, operation in sorted(operations.items()):
        examples = fuzz_examples(CHAT_EXAMPLES if "chat/completions" in name else OTHER_EXAMPLES)
        chat = "chat/completions" in name
        # a path's session id has no invalid form for the fuzzer: negative cases only for bodies
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)[: 2 if chat else 1]:
            fuzz_operation(operation, mode, examples, statuses, failures, after=_resume)
    report_fuzz("proxy", statuses, time.perf_counter() - started)
    assert not failures, "\n".join(failures[:10])
    assert sum(statuses.values()) >= fuzz_floor(1000), statuses
    assert statuses[200] > fuzz_floor(100), statuses  # it reached the model, not only the checks


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def _resume(operation: Any, response: Any) -> None:
    """A pause the fuzzer made is undone, so later calls are not held."""
    if operation.path == "/v1/rollout/pause" and response.status_code == 200:
        with asgi.get_client(operation.app) as client:  # the fuzzer's own loop and client
            resume = client.post("http://testserver/v1/rollout/resume", json={})
        assert resume.status_code == 200, resume.text
