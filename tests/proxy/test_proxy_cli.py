"""The installed ``dressage-proxy`` console script, run as the design documents run it.

    dressage-proxy --engine-url ... --token-build-model qwen3_5 --tito-model qwen3_5

must start (argparse used to refuse ``qwen3_5`` with exit 2) and serve the ``qwen3.5`` family;
``--help`` lists every accepted spelling.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dressage.proxy.server import READY_PREFIX
from tests.helpers import first_line_with, free_port, stop

pytestmark = pytest.mark.integration

SCRIPT = Path(sys.executable).with_name("dressage-proxy")


def _ready_url(proc: subprocess.Popen[str]) -> str:
    """The URL the proxy prints once it serves; fails with its exit status and stderr tail."""
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.startswith(READY_PREFIX):
            return line[len(READY_PREFIX) :].strip()
    raise AssertionError(
        f"dressage-proxy exited with {proc.wait(30)}: {proc.stderr.read()[-2000:]}"
    )


def test_the_console_script_accepts_the_underscore_family(tmp_path: Path) -> None:
    assert SCRIPT.is_file(), f"{SCRIPT}: the package's console script is not installed"
    argv = [str(SCRIPT), "--engine-url", f"http://127.0.0.1:{free_port()}", "--port", "0"]
    argv += ["--store-dir", str(tmp_path / "store")]
    argv += ["--token-build-model", "qwen3_5", "--tito-model", "qwen3_5"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _ready_url(proc)
        capabilities = httpx.get(f"{url}/v1/capabilities", timeout=30).json()
        assert capabilities["tito_model"] == "qwen3.5"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_console_script_help_lists_the_spellings() -> None:
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "{qwen3.5,qwen3_5,qwen3,llama3,deepseek,generic}" in done.stdout


def test_serve_logs_one_ready_line_once_health_answers(tmp_path: Path) -> None:
    engine = f"http://127.0.0.1:{free_port()}"  # no engine needed: the proxy serves without one
    argv = [sys.executable, "-m", "dressage.cli", "proxy", "serve", "--engine-url", engine]
    argv += ["--port", "0", "--store-dir", str(tmp_path / "store")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = first_line_with(proc.stderr, "dressage proxy ready at ", timeout_s=300)
        match = re.search(
            r"ready at (http://127\.0\.0\.1:\d+), in front of the engine at (\S+)", line
        )
        assert match, line
        assert httpx.get(f"{match[1]}/health", timeout=10).status_code == 200  # already answers
        assert match[2] == engine
    finally:
        stop(proc)
