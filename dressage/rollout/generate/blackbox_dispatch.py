"""slime's custom generate for black-box agents: run the agent in a proxy session, expand.

    --custom-generate-function-path dressage.rollout.generate.blackbox_dispatch.generate

slime awaits ``generate(args, sample, sampling_params, evaluation=...)`` once per sample
(docs/slime.md §2). Here that means:

1. a fresh session id (the sample's index and group, the attempt, a random suffix);
2. the sample's agent (:mod:`~dressage.rollout.generate.settings`: ``metadata["agent"]``, else
   the run's) runs against ``{proxy}/sessions/{id}/v1`` with the prompt, the task's tools and
   slime's sampling params as request fields (:mod:`~dressage.rollout.generate.runners`);
3. the session is finalized and its segments expanded into sibling samples
   (:func:`~dressage.rollout.multi_segment.expand_segments_to_samples`; the anchor's
   ``response`` is the agent's final answer, which the reward hook scores).

Partial rollout (slime's ``--partial-rollout``, or the dispatch's own setting: see
:mod:`~dressage.rollout.generate.settings`): the agent's calls must keep their partial output
across a weight-update pause, whatever the proxy-wide ``--dressage-partial-rollout`` says. The
agent is a black box that only gets a base URL, so the dispatch asks it of the session: before
the agent starts, it opens the session with ``partial_rollout`` (``ProxyClient.open_session``;
the proxy keeps the flag in its store and applies it to every call of the session, whatever
client the agent uses, a command included). The OpenAI client the dispatch builds for a Python
agent also sends ``X-Dressage-Partial-Rollout: 1`` on every call: the proxy's per-call form of
the same request, which the step then records as the reason (``extra["partial_rollout"]``).

An attempt fails on a timeout, an agent error, a proxy error, or a session without segments;
the session is then discarded and a new one started, up to the configured attempts. A sample
whose attempts all fail comes back as one no-grad sample
(:func:`~dressage.rollout.multi_segment.mark_aborted_no_grad`, status FAILED) with the reasons
in ``metadata["no_grad_reason"]`` and the log: a broken agent never crashes the rollout.
What does raise is a broken run configuration, at the first sample: no proxy URL, an agent
that is not importable, or a white-box sample (its dataset's own ``generate_function_path``
should have been called).

``metadata["dressage_agent"]`` records the agent, the attempts, the run's turns, tool calls,
compactions and stop reason, and the failed attempts (with their sessions) if there were any.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import httpx

from dressage.agents.base import AgentResult, AgentTask
from dressage.proxy.client import PARTIAL_ROLLOUT_HEADER, ProxyClient, ProxyClientError
from dressage.rollout.generate.runners import AgentFailure, run_agent
from dressage.rollout.generate.settings import (
    AgentSpec,
    DispatchSettings,
    agent_sampling,
    dispatch_settings,
    parse_agent_spec,
)
from dressage.rollout.multi_segment import expand_segments_to_samples, mark_aborted_no_grad
from dressage.slime.sample_meta import AGENT_MODE, DATASET, TASK, describe
from dressage.types import Sample

__all__ = ["AGENT_META", "WhiteboxSampleError", "generate"]

log = logging.getLogger(__name__)

AGENT_META = "dressage_agent"
DISCARD_TIMEOUT_S = 30.0


class WhiteboxSampleError(ValueError):
    """A white-box sample reached the black-box dispatch: a wiring error, not an agent failure."""


class _AttemptFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


async def generate(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Sample]:
    """Run the sample's agent and return its segments as samples (see the module docstring).

    Raises:
        WhiteboxSampleError: the sample's dataset is white-box.
        ValueError: no proxy URL, or an agent that cannot be parsed or imported.
    """
    if sample.metadata.get(AGENT_MODE) == "whitebox":
        raise WhiteboxSampleError(
            f"{describe(sample)}: dataset {sample.metadata.get(DATASET)!r} is white-box; slime "
            "calls its generate_function_path (Sample.generate_function_path), never the "
            "black-box dispatch"
        )
    settings = dispatch_settings(args)
    spec = _agent_spec(sample, settings)
    task = _task(sample, sampling_params, settings)
    failures: list[str] = []
    async with ProxyClient(
        settings.proxy_url,
        admin_key=settings.admin_key,
        api_key=settings.api_key,
        timeout=settings.timeout_s,
    ) as proxy:
        for attempt in range(1, settings.attempts + 1):
            session_id = _session_id(sample, attempt)
            try:
                result, samples = await _attempt(
                    args, sample, spec, task, proxy, session_id, settings
                )
            except (_AttemptFailed, AgentFailure) as exc:
                failures.append(f"attempt {attempt} (session {session_id}): {exc}")
                log.warning("%s: agent %s failed: %s", describe(sample), spec, failures[-1])
                await _discard(proxy, session_id)
                if attempt < settings.attempts:
                    await asyncio.sleep(settings.retry_delay_s * attempt)
                continue
            for out in samples:
                out.metadata[AGENT_META] = _record(spec, attempt, result, failures)
            return samples
    return [_failed(sample, spec, failures, evaluation)]


def _agent_spec(sample: Sample, settings: DispatchSettings) -> AgentSpec:
    override = sample.metadata.get("agent")
    if not override:
        return settings.agent
    try:
        return parse_agent_spec(str(override))
    except ValueError as exc:
        raise ValueError(f"{describe(sample)} field=metadata.agent: {exc}") from None


def _json_safe(metadata: dict[str, Any]) -> dict[str, Any]:
    safe: dict[str, Any] = json.loads(json.dumps(metadata, default=str))
    return safe


def _task(sample: Sample, sampling_params: dict[str, Any], settings: DispatchSettings) -> AgentTask:
    meta = sample.metadata
    prompt = sample.prompt
    if not isinstance(prompt, str) and not isinstance(prompt, list):
        raise ValueError(f"{describe(sample)} field=prompt: text or chat messages, got {prompt!r}")
    try:
        return AgentTask(
            prompt=prompt,
            task=meta.get(TASK),
            sampling=agent_sampling(dict(sampling_params or {})),
            max_turns=int(meta.get("max_turns") or settings.max_turns),
            compact_after=int(meta.get("compact_after") or 2),
            metadata=_json_safe(meta),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{describe(sample)}: cannot build the agent task: {exc}") from None


def _session_id(sample: Sample, attempt: int) -> str:
    """Unique, and readable in the proxy's store: ``dressage-i12-g3-a1-<12 hex>``."""
    index = "x" if sample.index is None else sample.index
    group = "x" if sample.group_index is None else sample.group_index
    return f"dressage-i{index}-g{group}-a{attempt}-{uuid.uuid4().hex[:12]}"


async def _attempt(
    args: Any,
    sample: Sample,
    spec: AgentSpec,
    task: AgentTask,
    proxy: ProxyClient,
    session_id: str,
    settings: DispatchSettings,
) -> tuple[AgentResult, list[Sample]]:
    headers = None
    if settings.partial_rollout:
        await _open_with_partial_rollout(proxy, session_id)
        headers = {PARTIAL_ROLLOUT_HEADER: "1"}
    result = await run_agent(
        spec,
        task,
        base_url=proxy.session_base_url(session_id),
        session_id=session_id,
        api_key=proxy.api_key,
        timeout_s=settings.timeout_s,
        headers=headers,
    )
    try:
        segments = await proxy.finalize_session(session_id)
    except ProxyClientError as exc:
        if exc.status == 404:  # the proxy never saw the session
            raise _AttemptFailed("no_segments", "the agent made no model call") from None
        raise _AttemptFailed("proxy_error", f"finalize: {exc}") from None
    except httpx.HTTPError as exc:
        raise _AttemptFailed("proxy_error", f"finalize: {type(exc).__name__}: {exc}") from None
    if not segments:
        raise _AttemptFailed("no_segments", "the agent made no model call through the proxy")
    sample.session_id = session_id
    try:
        samples = expand_segments_to_samples(
            sample, segments, args=args, agent_response=result.final_answer, session_id=session_id
        )
    except ValueError as exc:
        raise _AttemptFailed("bad_segments", str(exc)) from None
    return result, samples


async def _open_with_partial_rollout(proxy: ProxyClient, session_id: str) -> None:
    """Ask partial rollout of every call of the session, before its agent runs."""
    try:
        await proxy.open_session(session_id, partial_rollout=True)
    except ProxyClientError as exc:
        raise _AttemptFailed("proxy_error", f"open: {exc}") from None
    except httpx.HTTPError as exc:
        raise _AttemptFailed("proxy_error", f"open: {type(exc).__name__}: {exc}") from None


async def _discard(proxy: ProxyClient, session_id: str) -> None:
    """Drop a failed attempt's session (best effort: it may not exist, the proxy may be down)."""
    try:
        await asyncio.wait_for(proxy.discard_session(session_id), DISCARD_TIMEOUT_S)
    except ProxyClientError as exc:
        if exc.status != 404:  # 404: the agent never reached the proxy
            log.warning("discarding session %s failed: %s", session_id, exc)
    except (httpx.HTTPError, TimeoutError) as exc:
        log.warning("discarding session %s failed: %s: %s", session_id, type(exc).__name__, exc)


def _record(
    spec: AgentSpec, attempts: int, result: AgentResult, failures: list[str]
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "agent": str(spec),
        "attempts": attempts,
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "tool_errors": result.tool_errors,
        "compactions": result.compactions,
        "stop_reason": result.stop_reason,
    }
    if failures:  # the attempts before the one that worked
        record["failures"] = list(failures)
    return record


def _failed(sample: Sample, spec: AgentSpec, failures: list[str], evaluation: bool) -> Sample:
    reason = f"agent {spec} failed {len(failures)} attempt(s); last: {failures[-1]}"
    log.error("%s: no-grad%s: %s", describe(sample), " (evaluation)" if evaluation else "", reason)
    sample.metadata[AGENT_META] = {"agent": str(spec), "attempts": len(failures)}
    sample.metadata[AGENT_META]["failures"] = failures
    return mark_aborted_no_grad(sample, reason=reason)
