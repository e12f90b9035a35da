"""docs/guide-own-task.md's worked example: a third task added from outside ``dressage/``
(examples/third_task/: an OpenAI-SDK agent, a command agent, a registered reward, a MOPD config)
runs on the embedded default. The guide's last commands run as written in a fresh clone, the
training run kept short (2 steps of 6 prompts, about a minute)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, bash_commands, fresh_clone

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("embedded_checkpoints")]

GUIDE = REPO / "docs/guide-own-task.md"


def _run(command: str, clone: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{command}\n{out[-4000:]}"
    return done.stdout


def test_the_guides_third_task_trains_on_the_embedded_default(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path / "dressage")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DRESSAGE_JOB"))}
    env |= {"AIRFLOW_HOME": str(tmp_path / "airflow_home"), "OMP_NUM_THREADS": "1"}
    venv, assets, check, demo = bash_commands(GUIDE)[-4:]
    assert venv == "make venv"
    assert "dressage demo" in demo and "examples/third_task/mopd.json" in demo
    _run(assets, clone, env)
    checked = _run(check, clone, env)
    assert "ok: examples/third_task/mopd.json: 2 teacher(s), 3 dataset(s)" in checked
    # as written, but its folders in the test's own (the last of a repeated flag wins)
    out = _run(
        f"{demo} --run-root {tmp_path}/runs --artifact-root {tmp_path}/artifacts", clone, env
    )
    assert "dressage_mopd run" in out and ": success" in out
    assert "steps: 2   teachers: 2" in out
    rows = []
    artifacts = out.split("artifacts: file://")[1].split()[0]
    for path in glob.glob(f"{artifacts}/**/samples/*.parquet", recursive=True):
        import pyarrow.parquet as pq

        rows += pq.read_table(path).to_pylist()
    double = [json.loads(r["metadata_json"]) for r in rows]
    double = [m for m in double if m.get("task") == "double"]
    assert double, "no row of the third task was trained on"
    agents = {m["dressage_agent"]["agent"] for m in double}
    assert agents <= {"third_task.agent.run", "cmd: python3 -m third_task.command_agent"}
    assert all(r["reward"] is not None for r in rows)  # scored, the third task by its own reward
