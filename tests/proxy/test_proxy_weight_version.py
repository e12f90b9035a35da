"""The weight version a chat completion states is the one recorded for its tokens, also when the
engine names its first weights as SGLang does by default (``"default"``, recorded as 0)."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from dressage.proxy.client import SyncProxyClient
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import running_proxy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine_weight_version() -> str:
    return "default"  # `dressage engine serve`'s and SGLang's own name for the first weights


def test_the_response_states_the_recorded_version(
    engine_url: str, tmp_path: Path, qwen35_tito: TITOTokenizer
) -> None:
    with running_proxy(engine_url, tmp_path, qwen35_tito) as url:
        agent = OpenAI(base_url=f"{url}/sessions/wv/v1", api_key="-", max_retries=0)
        raw = agent.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        (step,) = SyncProxyClient(url).read_trajectory("wv").steps
        (segment,) = SyncProxyClient(url).finalize_session("wv")
    assert step.output_versions and set(step.output_versions) == {0}
    assert segment.extra_info["weight_versions"] == [0]
    assert raw.http_response.json()["metadata"] == {"weight_version": "0"}
    assert step.extra["weight_version"] == "default"  # the engine's own name, kept as evidence
