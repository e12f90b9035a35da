"""Constraints behind the real sglang-router 0.3.2: it drops ``structural_tag`` and
``logit_bias`` from the ``sampling_params`` it forwards (docs/sglang.md section 6.1), so the proxy
refuses calls that need them (501, one sentence naming the key) while plain calls keep working;
the same calls sent straight to the engine are honoured (the OpenAI SDK -> the proxy -> the
router -> the embedded engine)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from openai import InternalServerError, OpenAI

from dressage.proxy.client import SyncProxyClient
from dressage.proxy.engine_client import EngineClient
from dressage.proxy.errors import ConstraintDropped
from dressage.proxy.router_fields import CHECKED_KEYS, RouterFieldCheck
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import running_proxy
from tests.proxy.router import serve_router
from tests.proxy.test_proxy_constraints import NO_THINK, USER, WEATHER

pytestmark = pytest.mark.integration

REQUIRED = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
BIASED = {"logit_bias": {"11": 5.0}}
CONSTRAINED = [pytest.param(REQUIRED, "structural_tag", id="tool_choice"),
               pytest.param(BIASED, "logit_bias", id="logit_bias")]  # fmt: skip


@pytest.fixture(scope="module")
def router_url(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("router") / "router.log"
    with serve_router(engine_url, log_file=log) as url:
        yield url


@pytest.fixture(scope="module")
def proxies(
    engine_url: str,
    router_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    qwen35_tito: TITOTokenizer,
) -> Iterator[dict[str, str]]:
    """One proxy behind the router, one in front of the engine itself."""
    with (
        running_proxy(router_url, tmp_path_factory.mktemp("routed"), qwen35_tito) as routed,
        running_proxy(engine_url, tmp_path_factory.mktemp("direct"), qwen35_tito) as direct,
    ):
        yield {"router": routed, "engine": direct}


def _call(url: str, session: str, **options: Any) -> Any:
    client = OpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=60, extra_body=NO_THINK, **options
    )


def _verdicts(url: str) -> dict[str, bool]:
    """Which checked keys reach the engine behind ``url``, each probed on its own."""

    async def probe() -> dict[str, bool]:
        engine = EngineClient(url, retries=0)
        check = RouterFieldCheck(engine)
        for key in CHECKED_KEYS:
            with contextlib.suppress(ConstraintDropped):
                await check.verified({key: "set"})
        await engine.aclose()
        return check.kept

    return asyncio.run(probe())


def test_the_probes_read_the_router_as_documented(router_url: str, engine_url: str) -> None:
    """docs/sglang.md section 6.1: 0.3.2 keeps json_schema, drops structural_tag and
    logit_bias; the engine itself keeps all three."""
    assert _verdicts(router_url) == {
        "structural_tag": False, "json_schema": True, "logit_bias": False,
    }  # fmt: skip
    assert _verdicts(engine_url) == dict.fromkeys(CHECKED_KEYS, True)


@pytest.mark.parametrize(("options", "key"), CONSTRAINED)
def test_a_dropped_constraint_is_refused(
    proxies: dict[str, str], options: dict[str, Any], key: str
) -> None:
    session = f"refused-{key}"
    with pytest.raises(InternalServerError) as refused:
        _call(proxies["router"], session, **options)
    assert refused.value.status_code == 501
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "constraint_dropped_by_router"
    assert f"sampling_params.{key}" in error["message"] and "drops it" in error["message"]
    # the refused call left nothing; the session goes on with a plain call
    plain = _call(proxies["router"], session)
    assert plain.choices[0].message is not None
    (step,) = SyncProxyClient(proxies["router"]).read_trajectory(session).steps
    assert len(step.output_ids) == plain.usage.completion_tokens


@pytest.mark.parametrize(("options", "key"), CONSTRAINED)
def test_the_same_constraint_reaches_a_plain_server(
    proxies: dict[str, str], options: dict[str, Any], key: str
) -> None:
    response = _call(proxies["engine"], f"direct-{key}", **options)
    if key == "structural_tag":
        assert response.choices[0].message.tool_calls, response.choices[0].message


def test_plain_and_streamed_calls_pass_the_router(proxies: dict[str, str]) -> None:
    client = OpenAI(base_url=f"{proxies['router']}/sessions/plain/v1", api_key="x", max_retries=0)
    chunks = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=20, extra_body=NO_THINK, stream=True
    )
    assert list(chunks)
    steps = SyncProxyClient(proxies["router"]).read_trajectory("plain").steps
    assert len(steps) == 1 and steps[0].output_ids
