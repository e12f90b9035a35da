"""scripts/chaos.py, the chaos run behind issue 15's and issue 28's closing figures: its smoke run
(``--quick``) ends with a JSON summary in which every part held (the training job killed with
``kill -9`` mid-run and run again among them), and the knobs it turns in the test suite
(``DRESSAGE_FUZZ_SCALE``, ``AUTH_REPORT``) do what they say."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import REPO, fuzz_examples, fuzz_floor, fuzz_scale, report_auth

SCRIPT = REPO / "scripts" / "chaos.py"


def _run(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env,
        cwd=REPO, timeout=timeout,
    )  # fmt: skip


QUICK_PARTS = ["kills", "damage", "soak", "engine_death", "fuzz", "suites", "resume"]
"""Every part but ``airflow`` (part 8): Airflow's four components and a three-step
``dressage_mopd`` run through them take 80 s with ``--quick`` on an idle 2-core machine, more
under CI's load, which CI's time does not allow beside tests/e2e/test_airflow_ui.py (the same
stack, run once); ``scripts/chaos.py --parts airflow`` measures it
(bench/results/chaos_airflow_cpu.log), and the tests below check its rules."""


@pytest.mark.integration
def test_the_quick_run_holds_in_every_part() -> None:
    done = _run("--quick", "--parts", ",".join(QUICK_PARTS), timeout=900)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, (summary.get("ok"), done.stderr[-3000:])
    assert summary["ok"] == dict.fromkeys(QUICK_PARTS, True)
    kills = summary["kills"]
    assert kills["answered"] > 0 and kills["lost"] == kills["duplicated"] == 0
    assert kills["segment_starts"].get("proxy_restarted", 0) > 0  # the sessions went on
    damage = summary["damage"]
    assert damage["damaged_session"]["marked_segments"] == [damage["flipped"]["segment_index"]]
    assert damage["exports_200"] == damage["exports"] > 0
    death = summary["engine_death"]
    assert death["ready_503"]["body"]["status"] == "not_ready"
    assert death["hung"] == 0 and death["retries"] == {"answered": death["calls"]}
    assert summary["fuzz"]["cases"] > 0 and summary["fuzz"]["5xx"] == 0
    suites = summary["suites"]
    assert suites["bad_credential_attempts"] == suites["bad_credentials_refused"] > 0
    resume = summary["resume"]  # killed after step 2 of 3, a checkpoint after every step
    (crashed,) = [r for r in resume["runs"] if r["run"] == "crashed"]
    assert crashed["killed_after"] == 2 and crashed["resumed_at"] in (2, 3)  # 2: save torn
    assert crashed["steps_lost"] <= resume["save_interval"] == 1
    assert resume["steps_complete"] == resume["runs_total"] == 2
    assert resume["duplicated_steps"] == resume["missing_steps"] == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--parts", "damage"], "damage works on the store that kills leaves"),
        (["--parts", "kills,nothing"], "unknown ['nothing']"),
        (["--soak-seconds", "0"], "--soak-seconds must be positive, got 0.0"),
        (["--kill-after", "5", "--resume-steps", "5"], "must be below --resume-steps 5"),
        (["--parts", "airflow", "--airflow-steps", "0"], "--airflow-steps must be positive, got 0"),
        (["--parts", "airflow", "--airflow-steps", "1"], "--airflow-steps must be at least 2"),
    ],
)
def test_arguments_that_cannot_run_are_refused(argv: list[str], needle: str) -> None:
    done = _run(*argv, timeout=60)
    assert done.returncode == 2 and needle in done.stderr, done.stderr


@pytest.mark.unit
def test_the_fuzz_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRESSAGE_FUZZ_SCALE", raising=False)
    assert (fuzz_scale(), fuzz_examples(225), fuzz_floor(1000)) == (1.0, 225, 1000)
    monkeypatch.setenv("DRESSAGE_FUZZ_SCALE", "10")
    assert (fuzz_examples(225), fuzz_floor(1000)) == (2250, 1000)  # CI's floor stays
    monkeypatch.setenv("DRESSAGE_FUZZ_SCALE", "0.05")
    assert (fuzz_examples(225), fuzz_examples(5), fuzz_floor(1000)) == (11, 1, 50)
    for bad in ("0", "-1", "nan", "inf", "ten", ""):
        monkeypatch.setenv("DRESSAGE_FUZZ_SCALE", bad)
        with pytest.raises(
            ValueError, match=f"DRESSAGE_FUZZ_SCALE must be a positive number, got {bad!r}"
        ):
            fuzz_scale()


@pytest.mark.unit
def test_auth_figures_go_to_the_named_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTH_REPORT", raising=False)
    report_auth("nowhere", 3, 3)  # no variable: nothing written, nothing raised
    monkeypatch.setenv("AUTH_REPORT", str(tmp_path / "auth.json"))
    report_auth("proxy admin routes", 108, 108)
    report_auth("engine control routes (both keys)", 120, 119)
    assert json.loads((tmp_path / "auth.json").read_text()) == {
        "proxy admin routes": {"attempts": 108, "refused": 108},
        "engine control routes (both keys)": {"attempts": 120, "refused": 119},
    }


def _airflow_part(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    return importlib.import_module("chaos_parts.airflow_restart")


AIRFLOW_HELD = {
    "run_state": "success",
    "train_try_number": 1,
    "job_alive_after_kills": True,
    "job_attempts": 1,
    "job_same_process": True,
    "steps_complete": True,
}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change", "holds"),
    [
        ({}, True),
        ({"run_state": "failed"}, False),
        ({"train_try_number": 2}, False),  # the task was retried: the job was submitted again
        ({"job_alive_after_kills": False}, False),
        ({"job_attempts": 2}, False),
        ({"job_same_process": False}, False),
        ({"steps_complete": False}, False),
    ],
)
def test_the_airflow_part_holds_only_on_the_first_try_of_a_surviving_job(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, object], holds: bool
) -> None:
    assert _airflow_part(monkeypatch).held(AIRFLOW_HELD | change) is holds


@pytest.mark.unit
def test_the_airflow_part_wants_every_step_once(monkeypatch: pytest.MonkeyPatch) -> None:
    check = _airflow_part(monkeypatch).steps_check
    whole = check({"steps": [0, 1, 2], "duplicated": [], "missing": []}, 3)
    assert whole == {
        "steps_logged": 3, "duplicated_steps": [], "missing_steps": [], "steps_complete": True
    }  # fmt: skip
    twice = check({"steps": [0, 1, 2], "duplicated": [1], "missing": []}, 3)
    assert twice["duplicated_steps"] == [1] and not twice["steps_complete"]
    short = check({"steps": [0, 1], "duplicated": [], "missing": []}, 3)
    assert short["missing_steps"] == [2] and not short["steps_complete"]


@pytest.mark.unit
def test_the_airflow_part_runs_airflow_as_make_airflow_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every Airflow setting scripts/airflow.sh exports, the part sets too (same value where
    the script's is fixed)."""
    env = _airflow_part(monkeypatch).airflow_env(tmp_path, 8123)
    script = (REPO / "scripts" / "airflow.sh").read_text()
    exported = dict(re.findall(r"^export (AIRFLOW__\w+)=(.*)$", script, re.M))
    exported |= dict.fromkeys(re.findall(r"^(AIRFLOW__\w+)=", script, re.M), "")
    assert len(exported) >= 9 and exported.keys() <= env.keys()
    for name, value in exported.items():
        if value and "$" not in value:
            assert env[name] == value, name
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8123/execution/"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "dags")
