"""update_weights_from_disk against a real engine: new weights without a restart, versions,
and bad checkpoints that leave the old weights serving."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dressage.engine.service import UNUSABLE_CHECKPOINT
from tests.engine.engine_oracle import greedy_reference
from tests.helpers import ENGINE_KEY, bearer

pytestmark = pytest.mark.integration

PROMPT = [random.Random(0).randrange(1000, 200_000) for _ in range(10)]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
EOS = 248046  # <|im_end|>, the tiny model's eos_token_id


@pytest.fixture(scope="module")
def url(tiny_model_path: Path) -> Iterator[str]:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=1024, weight_version="v0",
        admin_api_key=ENGINE_KEY,
    ) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def checkpoints(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A perturbed copy of the tiny model whose EOS logit dominates, and a wrongly shaped one."""
    root = tmp_path_factory.mktemp("weights")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        # Align the (tied) EOS row with the mean final hidden state: EOS becomes the argmax.
        hidden = model.model(torch.tensor([PROMPT])).last_hidden_state[0]
        direction = hidden.mean(0)
        model.lm_head.weight[EOS] = direction / direction.norm() * 60.0
    new = root / "eos-model"
    model.save_pretrained(new)
    small = Qwen3ForCausalLM(Qwen3Config(vocab_size=1024, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8))  # fmt: skip
    wrong = root / "wrong-shape"
    small.save_pretrained(wrong)
    corrupt = root / "corrupt"
    small.save_pretrained(corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    return {"new": new, "new_model": model, "wrong": wrong, "corrupt": corrupt}


def _generate(url: str, **sampling: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/generate",
        json={"input_ids": PROMPT, "sampling_params": GREEDY | sampling},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _update(url: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/update_weights_from_disk", json=body, timeout=120, headers=bearer(ENGINE_KEY)
    )


def test_bad_checkpoints_answer_400_and_old_weights_keep_serving(
    url: str, checkpoints: dict[str, Any], reference_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    before = _generate(url)["output_ids"]
    assert before == greedy_reference(reference_model, PROMPT, 8)
    for path in ("/nonexistent/model", str(checkpoints["wrong"])):
        r = _update(url, model_path=path, weight_version="never")
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["success"] is False and body["num_paused_requests"] == 0
        assert body["message"] == UNUSABLE_CHECKPOINT  # the reason is in the log only
    assert "not a directory" in caplog.text and "has shape" in caplog.text
    assert _generate(url)["output_ids"] == before
    assert httpx.get(f"{url}/model_info").json()["weight_version"] == "v0"


def test_update_switches_weights_and_version_then_eos_stops(
    url: str, checkpoints: dict[str, Any], reference_model: Any
) -> None:
    r = _update(url, model_path=str(checkpoints["new"]), weight_version="v1")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to v1.",
        "num_paused_requests": 0,
    }
    info = httpx.get(f"{url}/model_info").json()
    assert info["weight_version"] == "v1" and info["model_path"] == str(checkpoints["new"])
    out = _generate(url)
    assert out["output_ids"] == greedy_reference(checkpoints["new_model"], PROMPT, 8)
    assert out["output_ids"] != greedy_reference(reference_model, PROMPT, 8)
    assert out["meta_info"]["weight_version"] == "v1"
    # With the new weights EOS is the greedy choice: it ends generation and stays in output_ids.
    stopped = _generate(url, ignore_eos=False)
    assert stopped["output_ids"][-1] == EOS and len(stopped["output_ids"]) < 8
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert "<|im_end|>" not in stopped["text"]


def test_update_during_in_place_pause_keeps_tokens_and_records_versions(
    url: str, tiny_model_path: Path, reference_model: Any
) -> None:
    """The RL sequence: pause (in_place), new weights (no flush), continue. The request keeps
    its tokens and its meta_info says which version produced which."""
    _update(url, model_path=str(tiny_model_path), weight_version="v2")
    long = {"max_new_tokens": 150, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            httpx.post,
            f"{url}/generate",
            json={"input_ids": PROMPT, "sampling_params": long},
            timeout=120,
        )
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/v1/loads").json()["loads"][0]["num_running_reqs"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05)
        paused = httpx.post(
            f"{url}/pause_generation", json={"mode": "in_place"}, headers=bearer(ENGINE_KEY)
        )
        assert paused.status_code == 200
        refused = _update(url, model_path=str(tiny_model_path), weight_version="v3")
        assert refused.status_code == 400 and "flush_cache=false" in refused.json()["message"]
        ok = _update(url, model_path=str(tiny_model_path), weight_version="v3", flush_cache=False)
        assert ok.status_code == 200, ok.text
        httpx.post(f"{url}/continue_generation", json={}, headers=bearer(ENGINE_KEY))
        out = future.result(timeout=120).json()
    spans = out["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == ["v2", "v3"]
    assert (
        spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 150
    )
    assert out["meta_info"]["weight_version"] == "v3"
    assert out["output_ids"] == greedy_reference(reference_model, PROMPT, 150)


def test_concurrent_updates_one_wins_the_other_gets_409(url: str, tiny_model_path: Path) -> None:
    """Unpaused, an update waits for in-flight requests (new ones queue behind it); a second
    update meanwhile is refused."""

    def loads() -> dict[str, Any]:
        load: dict[str, Any] = httpx.get(f"{url}/v1/loads").json()["loads"][0]
        return load

    long = {"max_new_tokens": 900, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(
            httpx.post, f"{url}/generate", timeout=120,
            json={"input_ids": PROMPT, "rid": "in-flight", "sampling_params": long},
        )  # fmt: skip
        while loads()["num_running_reqs"] == 0:
            time.sleep(0.01)
        first = pool.submit(_update, url, model_path=str(tiny_model_path), weight_version="c1")
        while not loads()["gate_closed"]:  # checked, loaded, now draining in-flight requests
            time.sleep(0.01)
        second = _update(url, model_path=str(tiny_model_path), weight_version="c2")
        assert second.status_code == 409 and second.json()["success"] is False
        queued = pool.submit(
            httpx.post, f"{url}/generate", timeout=120,
            json={"input_ids": PROMPT, "sampling_params": GREEDY},
        )  # fmt: skip
        time.sleep(0.3)
        assert not first.done() and not queued.done()
        httpx.post(f"{url}/abort_request", json={"rid": "in-flight"}, headers=bearer(ENGINE_KEY))
        assert running.result().json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert first.result().status_code == 200
        assert queued.result().json()["meta_info"]["weight_version"] == "c1"
    assert httpx.get(f"{url}/model_info").json()["weight_version"] == "c1"
