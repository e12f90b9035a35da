"""The async driver's loop end to end on one machine: the embedded engine, the recording proxy,
the PyTorch trainer and the partial-async rollout with real OpenAI-SDK agents. Generation of
rollout N + 1 overlaps training on N; every weight update pauses the proxy, and the agents it
stopped continue with the new weights (their steps hold tokens of two versions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.config.proxy import ProxyConfig
from dressage.engine.testing import serve_engine
from dressage.proxy.client import SyncProxyClient
from dressage.proxy.testing import serve_proxy
from dressage.proxy.tito import create_tito_tokenizer
from dressage.rollout.partial_async_rollout import generate_rollout_partial_async
from dressage.training.embedded import EmbeddedTrainer, trainer_args
from dressage.training.embedded.async_backend import EmbeddedAsyncBackend, RolloutBatch
from dressage.training.embedded.rollout import EmbeddedRolloutManager
from dressage.training.proxy_pause_client import RolloutPause
from dressage.training.train_async_with_rollout_pause import train_async
from tests.helpers import ENGINE_KEY
from tests.rollout.partial_async_hooks import ListDataSource
from tests.training.async_driver_hooks import ADMIN, SESSIONS

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("alone_with_timing")]

HOOKS = "tests.training.async_driver_hooks"
NUM_ROLLOUT = 3


def test_async_training_with_partial_rollout_end_to_end(
    tiny_model_path: Path,
    qwen35_tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_ADMIN_KEY", ADMIN)
    tito = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=4096,
        admin_api_key=ENGINE_KEY,
    ) as engine_url:  # fmt: skip
        config = ProxyConfig(
            engine_url=engine_url,
            store_dir=tmp_path / "store",
            admin_key=ADMIN,
            engine_admin_key=ENGINE_KEY,
            partial_rollout=True,
            record_token_versions=True,
        )
        with serve_proxy(config, tito=tito) as proxy_url:
            args = trainer_args(
                hf_checkpoint=str(tiny_model_path),
                device="cpu",
                lr=1e-4,
                global_batch_size=4,
                num_rollout=NUM_ROLLOUT,
                update_weights_interval=1,
                rollout_batch_size=2,
                n_samples_per_prompt=2,
                rollout_temperature=1.0,
                custom_generate_function_path=f"{HOOKS}.generate",
                custom_rm_path=f"{HOOKS}.reward",
                dressage_proxy_url=proxy_url,
                dressage_async_groups_in_flight=2,
            )
            trained: list[tuple[RolloutBatch, dict[str, float]]] = []
            backend = EmbeddedAsyncBackend(
                trainer=EmbeddedTrainer(args),
                rollout_manager=EmbeddedRolloutManager(
                    args, ListDataSource(), rollout_fn=generate_rollout_partial_async
                ),
                engine_url=engine_url,
                engine_admin_key=ENGINE_KEY,
                weights_dir=tmp_path / "weights",
                on_trained=lambda batch, metrics: trained.append((batch, metrics)),
            )
            pause = RolloutPause(proxy_url=proxy_url, admin_key=ADMIN, required=True, timeout_s=60)
            train_async(args, backend, pause)
            with SyncProxyClient(proxy_url, admin_key=ADMIN) as admin:
                state = admin.pause_state()
                steps = [s for session in SESSIONS for s in admin.read_trajectory(session).steps]
        engine_version = httpx.get(f"{engine_url}/model_info").json()["weight_version"]

    # Every update was paused and resumed with its version; agents were stopped mid-call.
    assert [e["version"] for e in pause.events] == [1, 2, 3, 4]
    assert all(e["paused"] and e["resume"]["weight_version"] == e["version"] for e in pause.events)
    assert sum(e["pause"]["paused_calls"] for e in pause.events) >= 1
    assert engine_version == "4" and state["weight_version"] == 4 and not state["paused"]

    # Rollout N + 1 was generated while rollout N trained.
    events = {(e.kind, e.rollout_id): e for e in backend.timeline}
    overlaps = [
        n
        for n in range(NUM_ROLLOUT - 1)
        if events[("generate", n + 1)].start < events[("train", n)].end
        and events[("train", n)].start < events[("generate", n + 1)].end
    ]
    assert overlaps, backend.timeline

    # Agent calls stopped by an update continued with the new weights: no token lost.
    resumed = [s for s in steps if s.extra.get("pauses")]
    assert resumed, "an update stopped agent calls in flight"
    spanning = [s for s in resumed if len(set(s.output_versions)) == 2]
    assert spanning, "a paused call kept its tokens and continued under the new version"
    for step in spanning:
        assert step.output_versions == sorted(step.output_versions)
        # an agent still running when the run ended was stopped by its client: its step is
        # kept as aborted and unanswered (issue 15); every answered one finished normally
        if step.extra.get("client_disconnected"):
            assert step.finish_reason == "abort"
        else:
            assert step.finish_reason in ("stop", "length")
    assert any(not s.extra.get("client_disconnected") for s in spanning)

    # Each step trained on a full batch of groups carried through the background worker.
    assert [b.rollout_id for b, _ in trained] == list(range(NUM_ROLLOUT))
    moved = 0
    for batch, metrics in trained:
        assert len({s.group_index for s in batch.samples}) == 2
        assert metrics["train/num_steps"] == 1
        # GRPO's gradient is zero exactly when every group's samples tied on reward (the even-
        # token share of two 64-token answers ties now and then); otherwise the step moved
        rewards: dict[int, set[float]] = {}
        for sample in batch.samples:
            rewards.setdefault(sample.group_index, set()).add(float(sample.reward))
        if any(len(group) > 1 for group in rewards.values()):
            assert metrics["train/grad_norm"] > 0, (rewards, metrics)
            moved += 1
        else:
            assert metrics["train/grad_norm"] == 0, (rewards, metrics)
        assert batch.metrics["partial_async/groups_started"] >= 2 * (batch.rollout_id + 1)
        for sample in batch.samples:
            start = sample.metadata["dressage_group_start_version"]
            assert start <= min(int(v) for v in sample.weight_versions)
    assert moved, "some group's rewards differed, and its step moved the weights"
