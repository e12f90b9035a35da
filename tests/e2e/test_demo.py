"""The main job as `make demo` runs it: dressage_mopd through Airflow's dag.test() with the real
training job on the embedded default (a short run: 2 steps of 2 prompts), in a fresh Airflow
home (SQLite), ending with the summary and the curves PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def test_make_demo_runs_dressage_mopd_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DRESSAGE_JOB"))}
    env |= {"AIRFLOW_HOME": str(tmp_path / "airflow_home"), "PYTHONUNBUFFERED": "1"}
    artifacts = tmp_path / "artifacts"
    argv = [sys.executable, "-m", "dressage.airflow.demo", "--steps", "2"]
    argv += ["--run-root", str(tmp_path / "runs"), "--artifact-root", artifacts.as_uri()]
    argv += ["--conf", json.dumps({"rollout_batch_size": 2})]
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    for task in ("validate", "start_services", "train", "stage", "check_segments", "publish"):
        assert f"{task:<18} success" in out, task
    assert "step 2/2" in out and "held-out reverse KL before training" in out  # live progress
    assert "held-out accuracy before training: " in out  # through the agent loop, per task
    assert "steps: 2   teachers: 2" in out
    assert "teacher accuracy  held-out accuracy (before -> after)" in out
    for teacher in ("calculator", "lookup"):
        assert f"  {teacher} " in out
    png = Path(out.split("PNG of the curves: ")[1].split()[0])
    assert png.is_file() and png.read_bytes().startswith(b"\x89PNG")
    assert png.is_relative_to(artifacts)
    assert (tmp_path / "airflow_home" / "airflow.db").is_file()  # Airflow's own SQLite
