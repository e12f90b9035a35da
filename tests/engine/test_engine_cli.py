"""``dressage engine serve`` as a real child process (what scripts and the e2e demo start)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dressage.engine.cli import config_from_args
from dressage.engine.config import ADMIN_KEY_ENV
from tests.helpers import ENGINE_KEY, first_line_with, stop


@pytest.mark.unit
def test_flags_map_to_the_config() -> None:
    config, level = config_from_args(
        [
            "--model",
            "/m",
            "--port",
            "0",
            "--device",
            "cpu",
            "--weight-version",
            "w7",
            "--api-key",
            "k",
        ]
    )
    assert (config.model_path, config.port, config.device, config.weight_version) == (
        "/m",
        0,
        "cpu",
        "w7",
    )
    assert config.host == "127.0.0.1" and config.api_key == "k" and level == "warning"
    with pytest.raises(ValueError, match="device must be"):
        config_from_args(["--model", "/m", "--device", "tpu"])


@pytest.mark.integration
def test_serve_in_a_subprocess(tiny_model_path: Path) -> None:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path, subprocess=True, device="cpu", num_threads=1, weight_version="cli"
    ) as url:
        assert url.startswith("http://127.0.0.1:")
        r = httpx.post(
            f"{url}/generate",
            json={"text": "hi", "sampling_params": {"max_new_tokens": 3}},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["meta_info"]["weight_version"] == "cli"
        info = httpx.get(f"{url}/server_info").json()
        assert info["device"] == "cpu" and info["host"] == "127.0.0.1"


@pytest.mark.integration
def test_serve_logs_one_ready_line_once_health_answers(tiny_model_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "dressage.cli",
        "engine",
        "serve",
        "--model",
        str(tiny_model_path),
    ]
    argv += ["--port", "0", "--device", "cpu", "--num-threads", "1", "--weight-version", "w3"]
    env = {**os.environ, ADMIN_KEY_ENV: ENGINE_KEY}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = first_line_with(proc.stderr, "dressage engine ready at ", timeout_s=300)
        match = re.search(r"ready at (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        assert httpx.get(f"{match[1]}/health", timeout=10).status_code == 200  # already answers
        assert f"model {tiny_model_path}, weight version w3" in line
    finally:
        stop(proc)


@pytest.mark.unit
def test_a_model_folder_that_is_not_one_and_a_bad_port_are_one_sentence(tmp_path: Path) -> None:
    from dressage.engine.cli import check_folders

    with pytest.raises(ValueError, match=r"^--model /nonexistent: no such folder"):
        check_folders(config_from_args(["--model", "/nonexistent", "--api-key", "k" * 8])[0])
    with pytest.raises(ValueError, match="no config.json in it"):
        check_folders(config_from_args(["--model", str(tmp_path), "--api-key", "k" * 8])[0])
    with pytest.raises(ValueError, match=r"port must be in \[0, 65535\], got -5"):
        config_from_args(["--model", "/m", "--port", "-5", "--api-key", "k" * 8])
