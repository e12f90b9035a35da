"""The embedded training job on CUDA: engine and trainer on the GPU, the probe beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from dressage.config.proxy import ProxyConfig
from dressage.config.run import TrainRunConfig
from dressage.engine.testing import serve_engine
from dressage.proxy.testing import serve_proxy
from dressage.tiny.checkpoints import resolve_checkpoint
from tests.helpers import ENGINE_KEY, REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.usefixtures("embedded_checkpoints"),
]

ADMIN = "admin-key-for-the-gpu-job"
EMBEDDED = REPO / "configs/mopd/embedded.json"


def test_a_mopd_run_on_cuda_trains_updates_the_engine_and_probes(tmp_path: Path) -> None:
    from dressage.config.mopd import load_mopd_config

    config = load_mopd_config(EMBEDDED)
    assert config.student is not None
    student = resolve_checkpoint(config.student.hf_checkpoint)
    with serve_engine(
        student, device="cuda", weight_version="0", admin_api_key=ENGINE_KEY
    ) as engine:
        proxy_config = ProxyConfig(
            engine_url=engine,
            store_dir=tmp_path / "store",
            admin_key=ADMIN,
            engine_admin_key=ENGINE_KEY,
            tokenizer_path=str(student),
            partial_rollout=True,
            record_token_versions=True,
        )
        with serve_proxy(proxy_config) as proxy:
            run = TrainRunConfig(
                objective="mopd",
                mopd_config=str(EMBEDDED),
                student=config.student.hf_checkpoint,
                engine_url=engine,
                proxy_url=proxy,
                output_dir=str(tmp_path / "output"),
                num_steps=3,
                seed=1,
                rollout_batch_size=4,
                advanced={
                    "device": "cuda",
                    "learning_rate": 2e-3,
                    "max_response_len": 24,
                    "agent_max_turns": 2,
                },
            )
            path = run.write(tmp_path / "run.json")
            done = subprocess.run(
                [sys.executable, "-m", "dressage.jobs.train", "--run-config", str(path)],
                cwd=REPO,
                env={
                    **os.environ,
                    "DRESSAGE_PROXY_ADMIN_KEY": ADMIN,
                    "DRESSAGE_ENGINE_ADMIN_KEY": ENGINE_KEY,
                },
                capture_output=True,
                text=True,
                timeout=500,
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            info = httpx.get(f"{engine}/model_info").json()
    print(done.stdout)
    assert info["weight_version"] == "4"  # initial push + one update per step
    records = [
        json.loads(line)
        for line in (tmp_path / "output" / "metrics.jsonl").read_text().splitlines()
    ]
    trained = [r for r in records if "train/mopd_reverse_kl" in r["metrics"]]
    assert [r["step"] for r in trained] == [0, 1, 2]
    for record in trained:
        kl = record["metrics"]["train/mopd_reverse_kl"]
        assert kl == kl  # not NaN
    # the held-out probe ran on the GPU: before training and at every eval interval (1 step)
    probed = [r["step"] for r in records if "eval/mopd/reverse_kl/all" in r["metrics"]]
    assert probed == [-1, 0, 1, 2], probed
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert set(summary["heldout_reverse_kl_initial"]) == {"calculator", "lookup", "all"}
