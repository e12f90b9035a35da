"""Third-party agent frameworks through the proxy: one real embedded engine and one proxy for all
of them, and the check every session ends with.

The engine serves the tiny random Qwen3.5-vocabulary model, so its tool calls and structured
answers come from the proxy's constrained decoding (``tool_choice`` required or named,
``response_format``, strict tools), as ``tests/proxy/test_proxy_constraints.py`` checks them.
Each session is held against the engine's own wire (:class:`~tests.proxy.wire_log.WireLog`):
every step is exactly one engine exchange, each segment's tokens are its steps' prompt deltas
and outputs, and its loss-masked tokens are exactly the completion tokens the engine sampled.
What each framework does to its history (segments, boundary reasons) is printed and asserted by
its own test module; ``docs/agent-frameworks.md`` reports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from dressage.proxy.client import SyncProxyClient
from dressage.proxy.tito import TITOTokenizer
from dressage.trajectory import Segment, StepRecord
from tests.helpers import ENGINE_KEY
from tests.proxy.conftest import running_proxy
from tests.proxy.wire_log import WireLog

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
MAX_TOKENS = 80
"""Room for one constrained tool call of the tiny model (30-60 tokens) and no more."""


City = Literal["Paris", "Rome"]
"""An enum, so that a random model under the schema finishes in a few tokens."""


class Forecast(BaseModel):
    """The structured answer every framework is asked for."""

    city: City
    sunny: bool


def get_weather(city: City) -> str:
    """The weather in a city."""
    return f"Sunny in {city}."


@dataclass
class Proxy:
    url: str
    wire: WireLog

    def base_url(self, session: str) -> str:
        return f"{self.url}/sessions/{session}/v1"


@dataclass
class SessionReport:
    """What one session left in the proxy."""

    steps: list[StepRecord]
    segments: list[Segment]

    @property
    def boundaries(self) -> list[str]:
        """Why each segment after the first began (its first step's ``boundary_reason``)."""
        return [s.boundary_reason for s in self.steps if s.boundary_reason is not None]

    @property
    def trained_tokens(self) -> int:
        return sum(sum(s.full_loss_mask) for s in self.segments)


@pytest.fixture(scope="package")
def framework_proxy(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory, qwen35_tito: TITOTokenizer
) -> Iterator[Proxy]:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=4096, admin_api_key=ENGINE_KEY
    ) as engine_url:
        wire = WireLog(engine_url)
        store = tmp_path_factory.mktemp("frameworks")
        with running_proxy(engine_url, store, qwen35_tito, engine=wire) as url:
            yield Proxy(url, wire)


def finish_session(proxy: Proxy, session: str) -> SessionReport:
    """Finalize ``session`` and check it token-exact against the engine's wire."""
    admin = SyncProxyClient(proxy.url)
    steps = admin.read_trajectory(session).steps
    segments = admin.finalize_session(session)
    assert steps, f"session {session} recorded nothing"
    # a refused answer has no meta_info: the proxy's probes of a constraint key
    # (dressage/proxy/router_fields.py), which the engine refuses by design
    answers = {a["meta_info"]["id"]: a for a in proxy.wire.answers if "meta_info" in a}
    requests = {q["rid"].rsplit("-", 1)[0]: q for q in proxy.wire.requests}
    so_far: dict[int, list[int]] = {}
    for step in steps:
        request = requests[step.request_id]
        before = so_far.setdefault(step.segment_index, [])
        assert step.prefix_length == len(before)
        assert request["input_ids"] == before + step.prompt_delta_ids
        answer = answers[request["rid"]]
        assert step.output_ids == answer["output_ids"]
        sampled = answer["meta_info"]["output_token_logprobs"]
        assert step.output_logprobs == [lp for lp, _, _ in sampled]
        before += step.prompt_delta_ids + step.output_ids
    assert [s.segment_index for s in segments] == sorted(so_far)
    for segment in segments:
        mine = [s for s in steps if s.segment_index == segment.segment_index]
        assert segment.tokens == so_far[segment.segment_index]
        masked = [t for t, m in zip(segment.tokens, segment.full_loss_mask, strict=True) if m]
        assert masked == [t for s in mine for t in s.output_ids]  # the completion tokens
    report = SessionReport(steps, segments)
    print(f"{session}: {len(steps)} calls, {len(segments)} segments, {report.boundaries}")
    return report
