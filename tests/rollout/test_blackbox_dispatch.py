"""The black-box dispatch against the real proxy and the real embedded engine (a tiny model).

Agents run as Python coroutines and as commands; every way an agent can fail (timeout,
exception, nothing recorded, a dead proxy) ends in one no-grad sample and never raises, and a
retry discards the failed session. What must raise is a broken run configuration. With partial
rollout on, the agent's calls keep their tokens across a rollout pause although the proxy runs
without ``--dressage-partial-rollout`` (the header for Python agents, the session for commands).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dressage.proxy.client import ProxyClient
from dressage.proxy.tito import TITOTokenizer
from dressage.rollout.generate.blackbox_dispatch import (
    AGENT_META,
    WhiteboxSampleError,
    generate,
)
from dressage.rollout.generate.settings import agent_sampling, dispatch_settings, parse_agent_spec
from dressage.schemas import samples_to_table, validate_table
from dressage.slime.sample_meta import NO_GRAD_REASON, NUM_SEGMENTS, PARENT_TRAJ_ID
from dressage.types import Sample
from tests.helpers import ENGINE_KEY, free_port
from tests.proxy.conftest import running_proxy
from tests.rollout import dispatch_agents

pytestmark = pytest.mark.integration

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 6, "no_stop_trim": True}


@pytest.fixture(scope="module")
def tito(qwen35_tokenizer: Any) -> TITOTokenizer:
    from dressage.proxy.tito import create_tito_tokenizer

    return create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")


@pytest.fixture(scope="module")
def proxy_url(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory, tito: TITOTokenizer
) -> Iterator[str]:
    from dressage.engine.testing import serve_engine

    store = tmp_path_factory.mktemp("store")
    with (
        serve_engine(
            tiny_model_path, device="cpu", num_threads=1, context_length=2048,
            admin_api_key=ENGINE_KEY,
        ) as engine,
        running_proxy(engine, store, tito, engine_retries=0, engine_admin_key=ENGINE_KEY) as url,
    ):  # fmt: skip
        yield url


def _args(url: str, **options: Any) -> SimpleNamespace:
    values = {"dressage_proxy_url": url, "dressage_agent_attempts": 1}
    values.update(options)
    return SimpleNamespace(**values)


def _sample(index: int = 7, **metadata: Any) -> Sample:
    meta = {"task": "calculator", "dataset": "calc", "teacher_id": "calc", "instance_id": "c-1"}
    meta.update(metadata)
    return Sample(
        prompt="Compute 2 + 3. Reply with the number only.",
        label="5",
        index=index,
        group_index=3,
        metadata=meta,
    )


def _generate(args: Any, sample: Sample, params: dict[str, Any] = PARAMS) -> list[Sample]:
    return asyncio.run(generate(args, sample, dict(params)))


def _trajectory(url: str, session: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/sessions/{session}/trajectory").json())


def test_python_agent_run_becomes_an_anchor_sample(proxy_url: str) -> None:
    (sample,) = _generate(_args(proxy_url, dressage_agent="tool_user"), _sample())
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert sample.rollout_id == 7 and sample.session_id.startswith("dressage-i7-g3-a1-")
    assert sample.metadata[PARENT_TRAJ_ID] == sample.session_id
    assert sample.metadata[NUM_SEGMENTS] == 1 and NO_GRAD_REASON not in sample.metadata
    assert sample.reward is None  # the anchor: left to the reward hook
    assert 1 <= sum(sample.loss_mask or []) <= 6  # max_new_tokens reached the engine
    assert sample.metadata[AGENT_META] == {
        "agent": "tool_user",
        "attempts": 1,
        "turns": 1,
        "tool_calls": 0,
        "tool_errors": 0,
        "compactions": 0,
        "stop_reason": sample.metadata[AGENT_META]["stop_reason"],
    }
    (step,) = _trajectory(proxy_url, sample.session_id)["steps"]
    assert step["messages"][-1]["role"] == "assistant"
    assert sample.response == (step["messages"][-1].get("content") or "").strip()
    assert validate_table("samples", samples_to_table([sample])).ok


def test_command_agent_gets_the_session_url_and_the_task_on_stdin(proxy_url: str) -> None:
    command = f"cmd: {sys.executable} -m dressage.agents tool_user"
    (sample,) = _generate(_args(proxy_url, dressage_agent=command), _sample(index=8))
    assert NO_GRAD_REASON not in sample.metadata, sample.metadata.get(NO_GRAD_REASON)
    assert sample.metadata[AGENT_META]["agent"].startswith("cmd: ")
    assert _trajectory(proxy_url, sample.session_id)["status"] == "finalized"
    assert sample.loss_mask and sum(sample.loss_mask) >= 1


def test_a_shell_agent_answers_on_stdout(proxy_url: str) -> None:
    # any program works: this one asks the model over plain HTTP, then prints its answer
    script = (
        "import json, os, sys, urllib.request; task = json.load(sys.stdin); "
        "body = json.dumps({'model': 'm', 'max_tokens': 3, 'messages': "
        "[{'role': 'user', 'content': task['prompt']}]}).encode(); "
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, "
        "{'content-type': 'application/json'}); urllib.request.urlopen(req).read(); print('5')"
    )
    command = f'cmd: {sys.executable} -c "{script}" {{session_id}}'
    (sample,) = _generate(_args(proxy_url, dressage_agent=command), _sample(index=9))
    assert NO_GRAD_REASON not in sample.metadata, sample.metadata.get(NO_GRAD_REASON)
    assert sample.response == "5"


def test_a_command_may_print_only_its_final_answer_as_json(proxy_url: str) -> None:
    """The contract asks for ``{"final_answer": ...}`` on the last line, nothing more."""
    script = (
        "import json, os, sys, urllib.request; task = json.load(sys.stdin); "
        "body = json.dumps({'model': 'm', 'max_tokens': 3, 'messages': "
        "[{'role': 'user', 'content': task['prompt']}]}).encode(); "
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, "
        "{'content-type': 'application/json'}); urllib.request.urlopen(req).read(); "
        "print(json.dumps({'final_answer': '7'}))"
    )
    command = f'cmd: {sys.executable} -c "{script}"'
    (sample,) = _generate(_args(proxy_url, dressage_agent=command), _sample(index=10))
    assert NO_GRAD_REASON not in sample.metadata, sample.metadata.get(NO_GRAD_REASON)
    assert sample.response == "7"


@pytest.mark.parametrize(
    ("agent", "kind"),
    [
        (
            "tests.rollout.dispatch_agents.broken",
            "agent_error: agent tests.rollout.dispatch_agents",
        ),
        ("tests.rollout.dispatch_agents.silent", "no_segments: the agent made no model call"),
        ("cmd: echo oops >&2; exit 3", "agent_error: command 'echo oops >&2; exit 3' exited"),
    ],
)
def test_failed_agents_end_as_no_grad_samples(proxy_url: str, agent: str, kind: str) -> None:
    (sample,) = _generate(_args(proxy_url, dressage_agent=agent), _sample(index=10))
    reason = sample.metadata[NO_GRAD_REASON]
    assert kind in reason and "failed 1 attempt(s)" in reason
    assert sample.status == Sample.Status.FAILED and sample.remove_sample
    assert sample.reward == 0.0 and sample.loss_mask and not any(sample.loss_mask)
    assert sample.rollout_id == 10
    assert validate_table("samples", samples_to_table([sample])).ok
    if "exited" in kind:
        assert "oops" in reason  # the stderr tail is the evidence


@pytest.mark.parametrize("agent", ["tests.rollout.dispatch_agents.slow", "cmd: sleep 30"])
def test_timeouts_stop_the_agent_and_give_no_grad(proxy_url: str, agent: str) -> None:
    start = time.monotonic()
    args = _args(proxy_url, dressage_agent=agent, dressage_agent_timeout=1.5)
    (sample,) = _generate(args, _sample(index=11))
    assert time.monotonic() - start < 15
    assert "timeout:" in sample.metadata[NO_GRAD_REASON] and "1.5 s" in sample.metadata[
        NO_GRAD_REASON]  # fmt: skip
    assert sample.status == Sample.Status.FAILED


def test_a_retry_discards_the_failed_session_and_starts_a_new_one(proxy_url: str) -> None:
    dispatch_agents.ATTEMPTS.clear()
    args = _args(proxy_url, dressage_agent="tests.rollout.dispatch_agents.flaky")
    args.dressage_agent_attempts = 2
    (sample,) = _generate(args, _sample(index=12))
    assert NO_GRAD_REASON not in sample.metadata, sample.metadata.get(NO_GRAD_REASON)
    assert sample.metadata[AGENT_META]["attempts"] == 2
    assert sample.session_id.startswith("dressage-i12-g3-a2-")
    (failure,) = sample.metadata[AGENT_META]["failures"]
    assert "lost the sandbox" in failure
    first = failure.split("(session ")[1].split(")")[0]
    assert first.startswith("dressage-i12-g3-a1-")
    assert _trajectory(proxy_url, first)["status"] == "discarded"  # with its recorded call
    assert len(_trajectory(proxy_url, first)["steps"]) == 1
    assert _trajectory(proxy_url, sample.session_id)["status"] == "finalized"


def test_all_attempts_failing_lists_every_attempt(proxy_url: str) -> None:
    args = _args(proxy_url, dressage_agent="tests.rollout.dispatch_agents.broken")
    args.dressage_agent_attempts = 3
    (sample,) = _generate(args, _sample(index=13))
    failures = sample.metadata[AGENT_META]["failures"]
    assert len(failures) == 3 and all("the tool server exploded" in f for f in failures)
    sessions = [f.split("(session ")[1].split(")")[0] for f in failures]
    assert len(set(sessions)) == 3
    for session in sessions:
        assert _trajectory(proxy_url, session)["status"] == "discarded"


def test_a_dead_proxy_gives_no_grad_and_never_raises() -> None:
    args = _args(f"http://127.0.0.1:{free_port()}", dressage_agent="tool_user")
    args.dressage_agent_attempts = 2
    (sample,) = _generate(args, _sample(index=14))
    assert "APIConnectionError" in sample.metadata[NO_GRAD_REASON]
    assert "failed 2 attempt(s)" in sample.metadata[NO_GRAD_REASON]
    assert sample.remove_sample and sample.status == Sample.Status.FAILED


def test_many_samples_run_concurrently(proxy_url: str) -> None:
    args = _args(proxy_url, dressage_agent="tool_user")

    async def batch() -> list[list[Sample]]:
        return list(
            await asyncio.gather(
                *(generate(args, _sample(index=100 + i), PARAMS) for i in range(6))
            )
        )

    results = asyncio.run(batch())
    sessions = {s.session_id for (s,) in results}
    assert len(sessions) == 6 and all(NO_GRAD_REASON not in s.metadata for (s,) in results)


def test_configuration_errors_raise_naming_the_sample(
    proxy_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    white = _sample(index=15, agent_mode="whitebox", dataset="hotpot")
    with pytest.raises(WhiteboxSampleError, match="sample index=15 .*'hotpot' is white-box"):
        _generate(_args(proxy_url), white)
    monkeypatch.delenv("DRESSAGE_PROXY_URL", raising=False)
    with pytest.raises(ValueError, match="needs the proxy: set args.dressage_proxy_url"):
        _generate(SimpleNamespace(), _sample())
    with pytest.raises(ValueError, match="sample index=16 .*field=metadata.agent"):
        _generate(_args(proxy_url), _sample(index=16, agent="not an agent"))
    with pytest.raises(ValueError, match="must be an async function"):
        _generate(
            _args(proxy_url, dressage_agent="tests.rollout.dispatch_agents.not_async"), _sample()
        )


def test_per_sample_agent_and_env_settings(proxy_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_URL", proxy_url)
    monkeypatch.setenv("DRESSAGE_AGENT", "tests.rollout.dispatch_agents.silent")
    (failed,) = _generate(SimpleNamespace(dressage_agent_attempts=1), _sample(index=17))
    assert "tests.rollout.dispatch_agents.silent" in failed.metadata[NO_GRAD_REASON]
    (ok,) = _generate(SimpleNamespace(), _sample(index=18, agent="compacting"))
    assert ok.metadata[AGENT_META]["agent"] == "compacting"


GENERATED = 1024


async def _pause_once_in_flight(url: str) -> None:
    """Pause the proxy once a call generates (it has tokens by then), then resume it."""
    proxy = ProxyClient(url)
    try:
        for _ in range(3000):
            if (await proxy.pause_state())["in_flight"]:
                break
            await asyncio.sleep(0.01)
        seen = time.monotonic()
        await asyncio.sleep(0.3)
        report = await proxy.pause_rollout("dispatch test", timeout_seconds=60)
        waited = time.monotonic() - seen  # the evidence if a stalled loop let the call finish
        assert report["in_flight_at_pause"] == 1, (round(waited, 3), report)
    finally:  # never leaves the module's proxy paused for the next test
        await proxy.resume_rollout(reason="dispatch test")
        await proxy.aclose()


@pytest.mark.parametrize(
    ("agent", "partial_rollout", "asked"),
    [
        ("tool_user", True, "header"),
        (f"cmd: {sys.executable} -m dressage.agents tool_user", True, "session"),
        ("tool_user", False, None),
    ],
)
def test_partial_rollout_keeps_the_agent_calls_tokens_across_a_pause(
    proxy_url: str, agent: str, partial_rollout: bool, asked: str | None
) -> None:
    # slime's --partial-rollout; the proxy runs without --dressage-partial-rollout
    args = _args(proxy_url, dressage_agent=agent, dressage_agent_max_turns=1)
    args.partial_rollout = partial_rollout
    # long enough to be caught by the pause 0.3 s in: about 5 s on one CPU core, so a loaded
    # CI machine that stalls the test's loop for a second still pauses it mid-generation
    params = {**PARAMS, "max_new_tokens": GENERATED}

    async def run() -> list[Sample]:
        samples, _ = await asyncio.gather(
            generate(args, _sample(index=20), params), _pause_once_in_flight(proxy_url)
        )
        return samples

    (sample,) = asyncio.run(run())
    assert NO_GRAD_REASON not in sample.metadata, sample.metadata.get(NO_GRAD_REASON)
    (step,) = _trajectory(proxy_url, sample.session_id)["steps"]
    extra = step["extra"]
    assert extra["pauses"] == 1 and extra["engine_requests"] == 2
    if partial_rollout:  # continued from its partial output: nothing generated was dropped
        assert "discarded_tokens" not in extra, extra["discarded_tokens"]
    else:  # as before: the call started again from its prompt
        assert extra["discarded_tokens"] > 0
    assert extra.get("partial_rollout") == asked  # how the proxy was asked: header or session
    assert extra["segment"]["flags"]["dressage_partial_rollout"] is partial_rollout
    assert len(step["output_ids"]) == GENERATED and sum(sample.loss_mask or []) == GENERATED


def test_partial_rollout_setting_comes_from_slime_args_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DRESSAGE_AGENT_PARTIAL_ROLLOUT", raising=False)
    url = "http://127.0.0.1:1"
    assert not dispatch_settings(_args(url)).partial_rollout
    assert not dispatch_settings(_args(url, partial_rollout=False)).partial_rollout
    assert dispatch_settings(_args(url, partial_rollout=True)).partial_rollout
    assert dispatch_settings(_args(url, dressage_partial_rollout="true")).partial_rollout
    assert not dispatch_settings(_args(url, dressage_partial_rollout="0")).partial_rollout
    monkeypatch.setenv("DRESSAGE_AGENT_PARTIAL_ROLLOUT", "1")
    assert dispatch_settings(_args(url, partial_rollout=False)).partial_rollout


def test_slime_sampling_params_map_to_request_fields() -> None:
    params = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_new_tokens": 32,
        "stop": None,
        "stop_token_ids": [],
        "sampling_seed": 5,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    assert agent_sampling(params) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 32, "seed": 5}
    assert agent_sampling({"top_k": 20, "stop": ["x"]}) == {"top_k": 20, "stop": ["x"]}
    assert str(parse_agent_spec(" cmd:  run-me --fast ")) == "cmd: run-me --fast"
    with pytest.raises(ValueError, match="'cmd:' needs a command"):
        parse_agent_spec("cmd:")
