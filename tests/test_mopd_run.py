"""dressage.testing.mopd_run: the routing controls it writes, the crash it causes and what it
reads back (the job itself: tests/e2e; a job killed and resumed: tests/test_chaos_script.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dressage.config.mopd import load_mopd_config
from dressage.launch.base import JobSpec, JobState
from dressage.launch.local import LocalLauncher
from dressage.testing.mopd_run import (
    STEP_RECORD_KEY,
    CrashResume,
    logged_steps,
    routed_config,
    run_job_process,
)
from tests.helpers import REPO

pytestmark = pytest.mark.unit

EMBEDDED = REPO / "configs/mopd/embedded.json"


def _routes(path: Path) -> dict[str, str]:
    return {ds["name"]: ds["teacher_id"] for ds in json.loads(path.read_text())["datasets"]}


def test_routings_change_only_who_scores_each_dataset(tmp_path: Path) -> None:
    configured = routed_config(EMBEDDED, "configured", tmp_path)
    assert _routes(configured) == {"calculator": "calculator", "lookup": "lookup"}
    assert _routes(routed_config(EMBEDDED, "swapped", tmp_path)) == {
        "calculator": "lookup",
        "lookup": "calculator",
    }
    one = routed_config(EMBEDDED, "one_teacher", tmp_path)
    assert _routes(one) == {"calculator": "calculator", "lookup": "calculator"}
    assert list(json.loads(one.read_text())["teachers"]) == ["calculator"]
    other = routed_config(EMBEDDED, "one_teacher", tmp_path, teacher="lookup")
    assert other.name == "one_teacher-lookup.json"
    assert _routes(other) == {"calculator": "lookup", "lookup": "lookup"}
    assert list(json.loads(other.read_text())["teachers"]) == ["lookup"]
    for path in (configured, one, other):  # each loads as a valid config from its new folder
        config = load_mopd_config(path)
        assert all(Path(ds.path).is_file() for ds in config.datasets)


def test_a_bad_routing_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="routing 'sideways'"):
        routed_config(EMBEDDED, "sideways", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no teacher 'math'"):
        routed_config(EMBEDDED, "one_teacher", tmp_path, teacher="math")
    with pytest.raises(ValueError, match="routing 'swapped' takes no teacher"):
        routed_config(EMBEDDED, "swapped", tmp_path, teacher="lookup")
    data = json.loads(EMBEDDED.read_text())
    data["datasets"][1]["teacher_id"] = "calculator"
    data["teachers"].pop("lookup")
    single = tmp_path / "single.json"
    single.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="swapping needs exactly two teachers"):
        routed_config(single, "swapped", tmp_path / "out")


def test_logged_steps_names_what_a_metrics_log_holds_twice_or_lacks(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"step": s, "time": 0.0, "metrics": {STEP_RECORD_KEY: 1.0}} for s in [0, 1, 1, 3]]
    for step in (-1, 3, 3):  # eval passes (before training, after step 4) are not steps
        records.append({"step": step, "time": 0.0, "metrics": {"eval/accuracy/all": 0.5}})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert logged_steps(path) == {"steps": [0, 1, 3], "duplicated": [1], "missing": [2]}


def test_steps_lost_counts_what_the_second_attempt_trains_again() -> None:
    assert CrashResume(55, 51, "iter_0000049", 1.0).steps_lost == 5
    assert CrashResume(2, None, None, 1.0).steps_lost == 2  # no checkpoint: started afresh


def test_the_job_is_killed_once_it_prints_the_step_and_a_retry_starts_a_new_attempt(
    tmp_path: Path,
) -> None:
    program = (
        "import pathlib, time\n"
        "marker = pathlib.Path('attempts'); n = len(marker.read_text()) if marker.exists() else 0\n"
        "marker.write_text('x' * (n + 1))\n"
        "for i in range(1, 50 if n == 0 else 3):\n"
        "    print(f'step {i}/50 x=1', flush=True); time.sleep(0.05)\n"
    )
    launcher = LocalLauncher(tmp_path / "jobs")
    spec = JobSpec([sys.executable, "-c", program], submission_id="t", working_dir=str(tmp_path))
    status, kill_s = run_job_process(launcher, spec, kill_after_step=3)
    assert status.state is JobState.FAILED and kill_s is not None
    assert "without an exit record" in status.message  # the supervisor died with the job
    printed = (tmp_path / "jobs" / "t" / "job.log").read_text().splitlines()
    assert "step 3/50 x=1" in printed and len(printed) < 10
    # the retry (the same submission again) is a new attempt; it is not killed
    status, kill_s = run_job_process(launcher, spec)
    assert status.state is JobState.SUCCEEDED and kill_s is None
    assert (tmp_path / "jobs" / "t.attempt-1" / "job.log").is_file()
    assert (tmp_path / "attempts").read_text() == "xx"
