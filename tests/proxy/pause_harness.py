"""What the rollout-pause tests share: weight checkpoints, an engine client that keeps the wire,
the per-call check against it, and a log-prob oracle per weight version.

The oracle is what makes "every token carries the right version" testable: with temperature 1
the engine's log-prob of a token is ``log_softmax`` of the logits of the weights that produced
it, so a fresh full forward with each candidate checkpoint over ``prompt + output`` tells which
weights produced which token (they differ by far more than the engine's 1e-4 numerical error).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import torch

from dressage.proxy.engine_answers import EngineOutput
from dressage.proxy.engine_client import EngineClient, PromptIds
from dressage.trajectory import StepRecord
from tests.helpers import ENGINE_KEY, bearer

ADMIN = "admin-key-for-pause-tests"
API = "api-key-for-pause-tests"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def perturbed_checkpoints(base: Path, root: Path, count: int) -> list[Path]:
    """``count`` copies of the tiny model, each with its own noise on every weight."""
    from transformers import AutoModelForCausalLM

    out = []
    for k in range(count):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        with torch.no_grad():
            gen = torch.Generator().manual_seed(100 + k)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        path = root / f"weights-{k}"
        model.save_pretrained(path)
        out.append(path)
    return out


def update_engine(engine_url: str, model_path: Path, version: int, **body: Any) -> None:
    response = httpx.post(
        f"{engine_url}/update_weights_from_disk",
        json={"model_path": str(model_path), "weight_version": str(version), **body},
        headers=bearer(ENGINE_KEY),
        timeout=120,
    )
    assert response.status_code == 200, response.text


class WireLog(EngineClient):
    """The engine client, keeping each /generate body and the engine's final answer per rid;
    it sends the test engines' control key unless told another."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **{"admin_key": ENGINE_KEY, **options})
        self.requests: dict[str, dict[str, Any]] = {}
        self.answers: dict[str, dict[str, Any]] = {}

    def _payload(
        self,
        prompt: PromptIds,
        sampling: dict[str, Any],
        rid: str,
        stream: bool,
        top_logprobs: int = 0,
    ) -> bytes:
        body = super()._payload(prompt, sampling, rid, stream, top_logprobs)
        self.requests[rid] = json.loads(body)
        return body

    def _output(self, data: Any, rid: str) -> EngineOutput:
        self.answers[rid] = data
        return super()._output(data, rid)

    async def _chunks(self, batches: AsyncIterator[bytes], rid: str) -> AsyncIterator[EngineOutput]:
        async def tap() -> AsyncIterator[bytes]:
            async for block in batches:
                for line in block.split(b"\n"):
                    payload = line[5:].strip() if line.startswith(b"data:") else b""
                    if payload and payload != b"[DONE]":
                        data = json.loads(payload)
                        if (data.get("meta_info") or {}).get("finish_reason") is not None:
                            self.answers[rid] = data  # cumulative: the last chunk holds it all
                yield block

        async for out in super()._chunks(tap(), rid):
            yield out


def _answer_tokens(answer: dict[str, Any]) -> tuple[list[int], list[float], list[int]]:
    meta = answer["meta_info"]
    ids = [int(t[1]) for t in meta["output_token_logprobs"]]
    logprobs = [float(t[0]) for t in meta["output_token_logprobs"]]
    versions = [-1] * len(ids)
    for span in meta["weight_versions"]:
        for k in range(span["start"], span["end"]):
            versions[k] = int(span["version"])
    assert -1 not in versions, f"answer {meta['id']}: a token without a version span"
    return ids, logprobs, versions


def check_step_against_wire(step: StepRecord, wire: WireLog, *, keep_partial: bool) -> int:
    """The step holds exactly what the engine produced for its call, over all its requests:
    each continuation's prompt is the first prompt plus the output so far (or the first prompt
    again, without partial rollout) with the remaining budget. Returns the request count."""
    rids = []
    while f"{step.request_id}-{len(rids)}" in wire.requests:
        rids.append(f"{step.request_id}-{len(rids)}")
    assert rids, f"step {step.session_id}#{step.step_index}: no engine request on the wire"
    first = wire.requests[rids[0]]
    ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    for k, rid in enumerate(rids):
        request = wire.requests[rid]
        if not keep_partial:
            ids, logprobs, versions = [], [], []
        assert request["input_ids"] == first["input_ids"] + ids, f"{rid}: prompt"
        budget = first["sampling_params"]["max_new_tokens"]
        assert request["sampling_params"]["max_new_tokens"] == budget - len(ids), rid
        part = _answer_tokens(wire.answers[rid])
        if k < len(rids) - 1:
            assert wire.answers[rid]["meta_info"]["finish_reason"]["type"] == "abort", rid
        ids, logprobs, versions = ids + part[0], logprobs + part[1], versions + part[2]
    assert step.output_ids == ids, f"step {step.session_id}#{step.step_index}: output ids"
    assert step.output_logprobs == logprobs
    assert step.output_versions == versions
    return len(rids)


class VersionOracle:
    """Log-probs of every weight version's checkpoint (see the module docstring)."""

    def __init__(self, checkpoints: dict[int, Path]) -> None:
        from transformers import AutoModelForCausalLM

        loaded: dict[Path, Any] = {}
        for path in set(checkpoints.values()):
            loaded[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.models = {v: loaded[p] for v, p in checkpoints.items()}

    def _logprobs(self, model: Any, prompt: list[int], output: list[int]) -> list[float]:
        n = len(prompt)
        with torch.no_grad():
            hidden = model.model(torch.tensor([prompt + output])).last_hidden_state[0]
            logits = model.lm_head(hidden[n - 1 : n - 1 + len(output)]).float()
        logp = torch.log_softmax(logits, dim=-1)
        return [float(logp[i, tok]) for i, tok in enumerate(output)]

    def check(self, step: StepRecord, prompt: list[int]) -> tuple[int, int]:
        """Each token's recorded log-prob is its version's. Returns (tokens, tokens whose
        log-prob under every other checkpoint is more than 1e-3 away: the check could tell the
        versions apart there)."""
        output, recorded = step.output_ids, step.output_logprobs
        models = {id(m): m for m in self.models.values()}
        scored = {key: self._logprobs(m, prompt, output) for key, m in models.items()}
        distinct = 0
        for i, version in enumerate(step.output_versions):
            own = id(self.models[version])
            want = scored[own][i]
            assert abs(recorded[i] - want) < 2e-4, (
                f"step {step.session_id}#{step.step_index} token {i}: recorded log-prob "
                f"{recorded[i]:.5f}, version {version}'s weights give {want:.5f}"
            )
            others = [lps[i] for key, lps in scored.items() if key != own]
            distinct += all(abs(o - want) > 1e-3 for o in others)
        return len(output), distinct
