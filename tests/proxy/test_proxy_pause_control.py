"""Rollout pause and resume one case at a time, on the real embedded engine: idle pauses, double
pauses, resumes without a pause, the timeout, the engine's other pause modes, the baseline
without partial rollout, partial rollout asked per call (header, session flag) with the
proxy-wide switch off, the pause cap, and bad input (a clear 4xx that loses no generation)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from dressage.config.proxy import ProxyConfigError, config_from_argv
from dressage.proxy.client import PARTIAL_ROLLOUT_HEADER, ProxyClient, ProxyClientError
from dressage.proxy.errors import BadRequest
from dressage.proxy.pause_requests import parse_pause_request, parse_resume_request
from dressage.proxy.tito import TITOTokenizer
from dressage.rollout.multi_segment import expand_segments_to_samples
from dressage.types import Sample
from tests.proxy.conftest import running_proxy
from tests.proxy.pause_harness import (
    ADMIN,
    API,
    NO_THINK,
    WireLog,
    check_step_against_wire,
    perturbed_checkpoints,
    update_engine,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def new_weights(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_checkpoints(tiny_model_path, tmp_path_factory.mktemp("weights"), 1)[0]


def _engine_version(url: str) -> int:
    return int(httpx.get(f"{url}/model_info", timeout=10).json()["weight_version"])


class Env:
    """A proxy (fresh store, wire log) in front of the shared engine, with its admin client."""

    def __init__(self, proxy: str, wire: WireLog, engine_url: str) -> None:
        self.proxy, self.wire, self.engine_url = proxy, wire, engine_url
        self.admin = ProxyClient(proxy, admin_key=ADMIN)

    async def call(
        self,
        session: str,
        *,
        max_tokens: int,
        stream: bool = False,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        client = AsyncOpenAI(
            base_url=f"{self.proxy}/sessions/{session}/v1",
            api_key=API,
            max_retries=0,
            default_headers=headers,
        )
        params: dict[str, Any] = {
            "model": "dressage",
            "messages": [{"role": "user", "content": f"Count for {session}."}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": 7,
            "extra_body": {**NO_THINK, "ignore_eos": True},
        }
        try:
            if not stream:
                response = await client.chat.completions.create(**params)
                choice = response.choices[0]
                assert response.usage is not None
                return {"finish": choice.finish_reason, "tokens": response.usage.completion_tokens}
            finish, tokens = None, None
            chunks = await client.chat.completions.create(
                **params, stream=True, stream_options={"include_usage": True}
            )
            async for chunk in chunks:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                for c in chunk.choices:
                    finish = c.finish_reason or finish
            return {"finish": finish, "tokens": tokens}
        finally:
            await client.close()

    async def in_flight(self, count: int = 1, settle: float = 0.3) -> None:
        """Wait until ``count`` engine requests run, then a little longer (tokens exist)."""
        for _ in range(2000):
            if (await self.admin.pause_state())["in_flight"] >= count:
                await asyncio.sleep(settle)
                return
            await asyncio.sleep(0.01)
        raise AssertionError("no generation started")

    async def steps(self, session: str) -> list[Any]:
        return (await self.admin.read_trajectory(session)).steps


@pytest.fixture
def env_factory(engine_url: str, qwen35_tito: TITOTokenizer, tmp_path: Path) -> Iterator[Any]:
    stack: list[Any] = []

    def make(**config: Any) -> Env:
        wire = WireLog(engine_url, retries=0)
        cm = running_proxy(
            engine_url, tmp_path / f"store-{len(stack)}", qwen35_tito, engine=wire,
            admin_key=ADMIN, api_key=API, **config,
        )  # fmt: skip
        stack.append(cm)
        return Env(cm.__enter__(), wire, engine_url)

    yield make
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def test_pause_while_idle_holds_new_calls_until_resume(env_factory: Any) -> None:
    env = env_factory(partial_rollout=True)

    async def scenario() -> None:
        report = await env.admin.pause_rollout("idle", timeout_seconds=60)
        assert report["paused"] and report["paused_calls"] == 0
        assert report["in_flight_at_pause"] == 0
        call = asyncio.create_task(env.call("idle-1", max_tokens=8))
        await asyncio.sleep(0.5)
        assert not call.done(), "a call made while paused waits; it does not fail"
        state = await env.admin.pause_state()
        assert state["paused"] and state["waiting_calls"] == 1 and state["in_flight"] == 0
        assert not env.wire.requests, "nothing reached the engine while paused"
        resumed = await env.admin.resume_rollout(reason="idle done")
        assert resumed["was_paused"] and resumed["released_calls"] == 0
        assert resumed["weight_version"] == _engine_version(env.engine_url)
        result = await call
        assert result["finish"] == "length" and result["tokens"] == 8
        (step,) = await env.steps("idle-1")
        assert "pauses" not in step.extra
        assert check_step_against_wire(step, env.wire, keep_partial=True) == 1

    asyncio.run(scenario())


def test_double_pause_and_resume_without_pause(env_factory: Any) -> None:
    env = env_factory(partial_rollout=True)

    async def scenario() -> None:
        noop = await env.admin.resume_rollout(reason="nothing to resume")
        assert noop == {
            "resumed": False,
            "was_paused": False,
            "reason": "nothing to resume",
            "released_calls": 0,
            "weight_version": None,
        }
        first = await env.admin.pause_rollout("one")
        again = await env.admin.pause_rollout("two")
        assert again["already_paused"] and again["reason"] == "one" and again["pauses"] == 1
        assert first["pauses"] == 1
        with pytest.raises(ProxyClientError) as info:
            await env.admin.pause_rollout("three", mode="retract")
        assert info.value.status == 409 and "already paused in mode 'abort'" in str(info.value)
        assert (await env.admin.resume_rollout(reason="r1"))["was_paused"]
        assert not (await env.admin.resume_rollout(reason="r2"))["was_paused"]
        assert not (await env.admin.pause_state())["paused"]

    asyncio.run(scenario())


def test_a_pause_never_resumed_ends_by_itself(
    env_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    env = env_factory(partial_rollout=True)
    caplog.set_level(logging.WARNING, logger="dressage.proxy.pause_controller")

    async def scenario() -> None:
        call = asyncio.create_task(env.call("timeout-1", max_tokens=120))
        await env.in_flight()
        report = await env.admin.pause_rollout("forgotten", timeout_seconds=0.5)
        assert report["paused_calls"] == 1
        result = await call
        assert result == {"finish": "length", "tokens": 120}
        state = await env.admin.pause_state()
        assert not state["paused"] and state["auto_resumes"] == 1
        assert state["last_resume"]["auto"] and state["last_resume"]["released_calls"] == 1
        (step,) = await env.steps("timeout-1")
        assert step.extra["pauses"] == 1
        assert check_step_against_wire(step, env.wire, keep_partial=True) == 2

    asyncio.run(scenario())
    assert any("was not resumed within 0.5 s" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_retract_and_in_place_keep_the_request_at_the_engine(
    env_factory: Any, new_weights: Path, mode: str
) -> None:
    env = env_factory(partial_rollout=True, record_token_versions=True)

    async def scenario() -> None:
        old = _engine_version(env.engine_url)
        call = asyncio.create_task(env.call(f"{mode}-1", max_tokens=150, stream=True))
        await env.in_flight()
        report = await env.admin.pause_rollout(mode, mode=mode)
        assert report["mode"] == mode and report["paused_calls"] == 1
        # in_place keeps the KV cache of running requests: the update must not flush it
        await asyncio.to_thread(
            update_engine, env.engine_url, new_weights, old + 1, flush_cache=mode != "in_place"
        )
        resumed = await env.admin.resume_rollout(old + 1, mode)
        assert resumed["released_calls"] == 1 and resumed["engine_weight_version"] == old + 1
        assert await call == {"finish": "length", "tokens": 150}
        (step,) = await env.steps(f"{mode}-1")
        assert check_step_against_wire(step, env.wire, keep_partial=True) == 1
        versions = step.output_versions
        assert versions[0] == old and versions[-1] == old + 1 and versions == sorted(versions)

    asyncio.run(scenario())


def test_without_partial_rollout_a_paused_call_starts_again(
    env_factory: Any, new_weights: Path
) -> None:
    env = env_factory(partial_rollout=False)

    async def scenario() -> None:
        old = _engine_version(env.engine_url)
        plain = asyncio.create_task(env.call("restart-1", max_tokens=150))
        streamed = asyncio.create_task(env.call("restart-2", max_tokens=150, stream=True))
        await env.in_flight(2)
        report = await env.admin.pause_rollout("update")
        # the streamed call has sent tokens: it ends at once instead of being held
        assert report["in_flight_at_pause"] == 2 and report["paused_calls"] == 1
        await asyncio.to_thread(update_engine, env.engine_url, new_weights, old + 1)
        await env.admin.resume_rollout(old + 1, "update")
        assert await plain == {"finish": "length", "tokens": 150}
        (step,) = await env.steps("restart-1")
        assert check_step_against_wire(step, env.wire, keep_partial=False) == 2
        assert step.extra["discarded_tokens"] > 0 and set(step.output_versions) == {old + 1}
        # A streamed call cannot take back what it sent: it ends aborted with its tokens.
        result = await streamed
        (step,) = await env.steps("restart-2")
        assert result["finish"] == "abort" and 0 < result["tokens"] == len(step.output_ids) < 150
        assert step.finish_reason == "abort"

    asyncio.run(scenario())


def test_calls_that_ask_partial_rollout_keep_their_tokens_with_the_switch_off(
    env_factory: Any, new_weights: Path
) -> None:
    env = env_factory(partial_rollout=False, record_token_versions=True)
    ask = {PARTIAL_ROLLOUT_HEADER: "1"}

    async def scenario() -> None:
        old = _engine_version(env.engine_url)
        opened = await env.admin.open_session("ask-session", partial_rollout=True)
        assert opened == {"session_id": "ask-session", "status": "open", "partial_rollout": True}
        calls = {
            "ask-header": env.call("ask-header", max_tokens=150, headers=ask),
            "ask-stream": env.call("ask-stream", max_tokens=150, stream=True, headers=ask),
            "ask-session": env.call("ask-session", max_tokens=150),  # no header: the session's
            "ask-none": env.call("ask-none", max_tokens=150, headers={PARTIAL_ROLLOUT_HEADER: "0"}),
        }
        tasks = {session: asyncio.create_task(call) for session, call in calls.items()}
        await env.in_flight(4, settle=0.5)
        # (paused_calls is not checked: under load an aborted answer may outlast the settle time)
        assert (await env.admin.pause_rollout("update"))["in_flight_at_pause"] == 4
        await asyncio.to_thread(update_engine, env.engine_url, new_weights, old + 1)
        await env.admin.resume_rollout(old + 1, "update")
        for session, task in tasks.items():  # the streamed one too: it was not cut short
            assert await task == {"finish": "length", "tokens": 150}, session
        for session, asked in (
            ("ask-header", "header"), ("ask-stream", "header"), ("ask-session", "session")
        ):  # fmt: skip
            (step,) = await env.steps(session)
            assert check_step_against_wire(step, env.wire, keep_partial=True) == 2, session
            assert step.extra["partial_rollout"] == asked and step.extra["pauses"] == 1
            assert "discarded_tokens" not in step.extra, session
            versions = step.output_versions
            assert versions[0] == old and versions[-1] == old + 1, session
            (segment,) = await env.admin.finalize_session(session)
            assert segment.extra_info["dressage_partial_rollout"] is True
        # "0" asks nothing: as without the header, the call starts again from its prompt
        (step,) = await env.steps("ask-none")
        assert check_step_against_wire(step, env.wire, keep_partial=False) == 2
        assert "partial_rollout" not in step.extra and step.extra["discarded_tokens"] > 0
        assert set(step.output_versions) == {old + 1}
        (segment,) = await env.admin.finalize_session("ask-none")
        assert segment.extra_info["dressage_partial_rollout"] is False
        assert (await env.admin.pause_state())["partial_rollout"] is False  # the switch: off

    asyncio.run(scenario())


def test_the_pause_cap_ends_the_call_and_marks_the_trajectory(env_factory: Any) -> None:
    env = env_factory(partial_rollout=True, max_pauses_per_trajectory=1)

    async def scenario() -> None:
        call = asyncio.create_task(env.call("cap-1", max_tokens=800))
        await env.in_flight()
        await env.admin.pause_rollout("first")
        await env.admin.resume_rollout(reason="first")
        await env.in_flight(settle=0.2)
        await env.admin.pause_rollout("second")
        with pytest.raises(openai.ConflictError) as info:
            await call
        assert info.value.status_code == 409
        assert "session cap-1 has spanned 2 rollout pauses" in str(info.value)
        assert "--max-pauses-per-trajectory=1" in str(info.value)
        await env.admin.resume_rollout(reason="second")
        with pytest.raises(openai.ConflictError):  # the trajectory is over: later calls too
            await env.call("cap-1", max_tokens=4)
        (step,) = await env.steps("cap-1")
        assert step.finish_reason == "abort" and 0 < len(step.output_ids) < 800
        assert step.extra["pauses"] == 1 and "max-pauses" in step.extra["no_grad_reason"]
        (segment,) = await env.admin.finalize_session("cap-1")
        assert "spanned 2 rollout pauses" in segment.extra_info["no_grad_reason"]
        template = Sample(index=3, group_index=3, prompt="p")
        (sample,) = expand_segments_to_samples(template, [segment], args=SimpleNamespace())
        assert sample.remove_sample and sample.reward == 0.0 and not any(sample.loss_mask)
        assert "spanned 2" in sample.metadata["no_grad_reason"]

    asyncio.run(scenario())


def test_bad_input_is_a_clear_4xx_and_loses_no_generation(
    env_factory: Any, new_weights: Path
) -> None:
    env = env_factory(partial_rollout=True)

    async def scenario() -> None:
        call = asyncio.create_task(env.call("bad-1", max_tokens=300))
        await env.in_flight()
        http = httpx.AsyncClient(base_url=env.proxy, timeout=30)
        admin = {"authorization": f"Bearer {ADMIN}"}
        for headers in ({}, {"authorization": f"Bearer {API}"}, {"authorization": "Bearer x"}):
            r = await http.post("/v1/rollout/pause", json={}, headers=headers)
            assert r.status_code == 401, r.text
            assert (await http.post("/v1/rollout/resume", headers=headers)).status_code == 401
        bad = [
            ({"mode": "freeze"}, "invalid_mode", "unknown mode 'freeze'"),
            ({"timeout_seconds": -1}, "invalid_timeout", "got -1"),
            ({"timeout_seconds": 10**9}, "invalid_timeout", "(0, 86400]"),
            ({"timeout_seconds": "soon"}, "invalid_timeout", "'soon'"),
            ({"mode": "abort", "when": 1}, None, "unknown fields ['when']"),
            ([1], None, "must be a JSON object"),
        ]
        for body, code, needle in bad:
            r = await http.post("/v1/rollout/pause", json=body, headers=admin)
            assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
            assert r.json()["error"]["code"] == code
        r = await http.post("/v1/rollout/pause", content=b"{not json", headers=admin)
        assert r.status_code == 400
        for version in (-1, "x", 1.5, True):
            r = await http.post("/v1/rollout/resume", json={"version": version}, headers=admin)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_version"
        assert not (await env.admin.pause_state())["paused"], "no bad request paused anything"

        old = _engine_version(env.engine_url)
        await env.admin.pause_rollout("update")
        await asyncio.to_thread(update_engine, env.engine_url, new_weights, old + 1)
        await env.admin.resume_rollout(old + 1, "update")
        await env.in_flight(settle=0.1)
        await env.admin.pause_rollout("second")
        with pytest.raises(ProxyClientError) as info:
            await env.admin.resume_rollout(old, "stale")
        assert info.value.status == 409
        assert f"version {old} is older than the proxy's weight version {old + 1}" in str(
            info.value
        )
        assert (await env.admin.pause_state())["paused"], "a refused resume changes nothing"
        await env.admin.resume_rollout(old + 1, "second")
        await http.aclose()
        assert await call == {"finish": "length", "tokens": 300}
        (step,) = await env.steps("bad-1")
        assert check_step_against_wire(step, env.wire, keep_partial=True) >= 2
        assert len(step.output_ids) == 300

    asyncio.run(scenario())


@pytest.mark.unit
def test_the_default_timeout_and_the_cap_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC", "7.5")
    monkeypatch.setenv("DRESSAGE_PROXY_MAX_PAUSES_PER_TRAJECTORY", "3")
    config, _ = config_from_argv([])
    assert (config.pause_timeout_s, config.max_pauses_per_trajectory) == (7.5, 3)
    config, _ = config_from_argv(["--pause-timeout-sec", "9", "--max-pauses-per-trajectory", "0"])
    assert (config.pause_timeout_s, config.max_pauses_per_trajectory) == (9.0, 0)
    monkeypatch.delenv("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC")
    assert config_from_argv([])[0].pause_timeout_s == 300.0
    with pytest.raises(ProxyConfigError, match="--pause-timeout-sec=-1.0: Input should be greater"):
        config_from_argv(["--pause-timeout-sec", "-1"])


@pytest.mark.unit
def test_request_parsing() -> None:
    assert parse_pause_request(None, default_timeout_s=30.0).timeout_s == 30.0
    parsed = parse_pause_request({"reason": "u", "mode": "retract", "timeout_seconds": 2},
                                 default_timeout_s=30.0)  # fmt: skip
    assert (parsed.reason, parsed.mode, parsed.timeout_s) == ("u", "retract", 2.0)
    assert parse_resume_request({"version": "12"}).version == 12
    assert parse_resume_request({}).version is None
    for body in ({"timeout_seconds": 0}, {"timeout_seconds": float("nan")}, {"reason": 3}):
        with pytest.raises(BadRequest):
            parse_pause_request(body, default_timeout_s=30.0)
