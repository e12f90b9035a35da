"""dressage.testing.controls: the conditions of bench/mopd_transfer.py and its verdict."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dressage.testing.controls import (
    control_conditions,
    own_teacher_of,
    transfer_verdict,
)
from tests.helpers import REPO

pytestmark = pytest.mark.unit

EMBEDDED = REPO / "configs/mopd/embedded.json"
OWN = {"calculator": "calculator", "lookup": "lookup"}


def _table(**changes: dict[str, tuple[float, float]]) -> dict[str, dict[str, tuple[float, float]]]:
    """A run of the CPU controls: each one-teacher student learns only its teacher's task."""
    table = {
        "configured": {"calculator": (0.85, 0.03), "lookup": (1.0, 0.0)},
        "swapped": {"calculator": (0.0, 0.0), "lookup": (0.02, 0.03)},
        "one_teacher:calculator": {"calculator": (0.81, 0.05), "lookup": (0.04, 0.03)},
        "one_teacher:lookup": {"calculator": (0.05, 0.04), "lookup": (1.0, 0.0)},
        "no_training": {"calculator": (0.12, 0.0), "lookup": (0.06, 0.0)},
    }
    for name, row in changes.items():
        table[name] = {**table[name], **row}
    return table


def test_the_conditions_are_the_configured_swapped_and_each_single_teacher() -> None:
    names = [c.name for c in control_conditions(EMBEDDED)]
    assert names == ["configured", "swapped", "one_teacher:calculator", "one_teacher:lookup"]
    assert own_teacher_of(EMBEDDED) == OWN


def test_a_teacher_alone_on_its_own_task_is_judged_by_the_worst_task() -> None:
    verdict = transfer_verdict(_table(), OWN)
    assert verdict["met"] is True
    calculator = verdict["per_task"]["calculator"]
    # one_teacher:calculator scores calculator as configured does: not a control there
    assert calculator["strongest_control"] == "no_training"
    assert calculator["margin"] == pytest.approx(0.82 - 0.12)
    lookup = verdict["per_task"]["lookup"]
    assert lookup["strongest_control"] == "one_teacher:calculator"  # 4% +- 3% over 6% +- 0
    assert lookup["margin"] == pytest.approx(1.0 - 0.07)
    assert verdict["worst_task_margin"] == {
        "one_teacher:calculator": pytest.approx(0.82 - 0.07),
        "one_teacher:lookup": pytest.approx(0.82 - 0.09),
    }
    assert verdict["task"] == "calculator"
    assert (verdict["ours"], verdict["baseline"]) == (0.85, 0.12)


def test_a_control_within_the_spread_fails_the_verdict_on_its_task() -> None:
    verdict = transfer_verdict(_table(swapped={"lookup": (0.9, 0.1)}), OWN)
    assert verdict["met"] is False
    assert verdict["task"] == "lookup"
    assert verdict["per_task"]["lookup"]["strongest_control"] == "swapped"
    assert verdict["per_task"]["lookup"]["margin"] <= 0
    assert verdict["per_task"]["calculator"]["margin"] > 0


def test_one_teacher_that_teaches_both_tasks_fails_the_worst_task_rule() -> None:
    table = _table(**{"one_teacher:calculator": {"lookup": (0.9, 0.02)}})
    verdict = transfer_verdict(table, OWN)
    assert verdict["met"] is False
    assert verdict["worst_task_margin"]["one_teacher:calculator"] < 0
    # on lookup the calculator teacher alone is a control, and it is there too
    assert verdict["per_task"]["lookup"]["strongest_control"] == "one_teacher:calculator"


def test_a_missing_row_is_named() -> None:
    table = _table()
    del table["no_training"]
    with pytest.raises(ValueError, match=r"no_training/calculator"):
        transfer_verdict(table, OWN)


# -- bench/mopd_transfer.py --merge: runs made apart (a seed a call), judged together -----------


def _saved(
    tmp_path: Path, name: str, seed: int, *, lr: float = 2e-3, **recorded: str | int | None
) -> Path:
    """One --out file: the four conditions of one seed, each one-teacher run learning only its
    teacher's task; ``recorded``: further settings (a file from before they were recorded has
    none)."""
    after = {
        "configured": {"calculator": 0.8 + seed / 100, "lookup": 1.0},
        "swapped": {"calculator": 0.0, "lookup": 0.0},
        "one_teacher:calculator": {"calculator": 0.8, "lookup": 0.06},
        "one_teacher:lookup": {"calculator": 0.0, "lookup": 1.0},
    }
    before = {"calculator": 0.12, "lookup": 0.06}
    runs = [
        {"condition": c, "seed": seed, "before": before, "after": a, "seconds": 1.0}
        for c, a in after.items()
    ]
    settings = {
        "steps": 100,
        "prompts_per_step": 32,
        "lr": lr,
        "config": "configs/mopd/embedded.json",
        "device": "cuda",
        "seeds": [seed],
        "seconds": 200.0 + seed,
        **recorded,
    }
    path = tmp_path / name
    path.write_text(json.dumps({"runs": runs, "verdict": settings}))
    return path


def _merge(*files: Path, out: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--out", str(out)] if out else []
    return subprocess.run(
        [sys.executable, "bench/mopd_transfer.py", "--merge", *map(str, files), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_merge_judges_the_seeds_of_several_files_as_one_run(tmp_path: Path) -> None:
    files = [_saved(tmp_path, f"s{seed}.json", seed) for seed in (0, 1, 2)]
    done = _merge(*files, out=tmp_path / "all.json")
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["met"] is True
    assert verdict["seeds"] == [0, 1, 2]
    # files from before the objective was recorded: the dense recipe's runs
    assert (verdict["objective"], verdict["topk"]) == ("dense", None)
    assert done.stdout.startswith("objective dense\n")
    assert verdict["seconds_per_file"] == [200.0, 201.0, 202.0]
    configured = verdict["table"]["configured"]["calculator"]
    assert configured[0] == pytest.approx(0.81)
    assert configured[1] == pytest.approx(statistics.pstdev([0.8, 0.81, 0.82]), abs=1e-4)
    assert verdict["table"]["no_training"]["lookup"] == [0.06, 0.0]
    assert len(json.loads((tmp_path / "all.json").read_text())["runs"]) == 12


def test_merge_refuses_files_that_disagree_or_repeat_a_run(tmp_path: Path) -> None:
    first = _saved(tmp_path, "a.json", 0)
    other_lr = _saved(tmp_path, "b.json", 1, lr=1e-3)
    done = _merge(first, other_lr)
    assert done.returncode != 0
    assert f"--merge: {other_lr} has lr=0.001, the files before it 0.002" in done.stderr
    again = _saved(tmp_path, "c.json", 0)
    done = _merge(first, again)
    assert done.returncode != 0
    assert "repeats runs [('configured', 0)," in done.stderr


def test_merge_refuses_files_of_another_objective_or_k(tmp_path: Path) -> None:
    top4 = _saved(tmp_path, "a.json", 0, objective="topk", topk=4)
    top8 = _saved(tmp_path, "b.json", 1, objective="topk", topk=8)
    done = _merge(top4, top8)
    assert done.returncode != 0
    assert f"--merge: {top8} has topk=8, the files before it 4" in done.stderr
    # a file from before the objective was recorded ran the dense recipe
    unrecorded = _saved(tmp_path, "c.json", 1)
    done = _merge(top4, unrecorded)
    assert done.returncode != 0
    assert f"--merge: {unrecorded} has objective='dense', the files before it 'topk'" in done.stderr
    top4_again = _saved(tmp_path, "d.json", 1, objective="topk", topk=4)
    done = _merge(top4, top4_again)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("objective topk, K = 4\n")
    assert json.loads(done.stdout.strip().splitlines()[-1])["topk"] == 4


# -- bench/mopd_transfer.py --compare: the objectives of one setting side by side ---------------


def _objective_file(
    tmp_path: Path, objective: str, calculator: float, *, topk: int | None = None, **over: Any
) -> Path:
    """One --out file of ``objective`` whose configured runs reach ``calculator`` (lookup 1.0);
    ``over``: a setting that differs from the others'."""
    table = {
        "configured": {"calculator": [calculator, 0.03], "lookup": [1.0, 0.0]},
        "swapped": {"calculator": [0.04, 0.03], "lookup": [0.0, 0.0]},
        "no_training": {"calculator": [0.0, 0.0], "lookup": [0.0, 0.0]},
    }
    verdict = {
        "config": "configs/mopd/scale.json",
        "steps": 150,
        "prompts_per_step": 32,
        "lr": 1e-3,
        "seeds": [0, 1, 2],
        "objective": objective,
        "topk": topk,
        "table": table,
        **over,
    }
    curve = [[-1, 0.0], [9, calculator]]
    runs = [
        {
            "condition": "configured",
            "seed": seed,
            "accuracy_curves": {"calculator": curve, "lookup": curve},
            "heldout_kl_curves": {"calculator": [[-1, 2.0], [9, 0.3]], "lookup": []},
        }
        for seed in (0, 1, 2)
    ]
    path = tmp_path / f"{objective}{topk or ''}.json"
    path.write_text(json.dumps({"runs": runs, "verdict": verdict}))
    return path


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/mopd_transfer.py", "--compare", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compare_judges_topk_against_dense_on_each_task(tmp_path: Path) -> None:
    dense = _objective_file(tmp_path, "dense", 0.72)
    sampled = _objective_file(tmp_path, "sampled", 0.0)
    close = _objective_file(tmp_path, "topk", 0.70, topk=16)
    png = tmp_path / "c.png"
    done = _compare(str(close), str(dense), str(sampled), "--plot", str(png))
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["share_of_dense"] == {"calculator": round(0.70 / 0.72, 4), "lookup": 1.0}
    assert verdict["ratio"] == round(0.70 / 0.72, 4) and verdict["met"] is True
    assert verdict["configured"]["sampled"]["calculator"] == [0.0, 0.03]
    assert png.stat().st_size > 10_000
    far = _objective_file(tmp_path, "topk", 0.60, topk=8)  # 83% of dense's calculator
    verdict = json.loads(_compare(str(far), str(dense)).stdout.strip().splitlines()[-1])
    assert verdict["met"] is False and verdict["share_of_dense"]["calculator"] == 0.8333


def test_compare_refuses_files_of_another_setting(tmp_path: Path) -> None:
    dense = _objective_file(tmp_path, "dense", 0.72, steps=100)
    topk = _objective_file(tmp_path, "topk", 0.70, topk=16)
    done = _compare(str(topk), str(dense))
    assert done.returncode != 0
    assert "--compare: dense has steps=100, the first file 150" in done.stderr
    done = _compare(str(_objective_file(tmp_path, "sampled", 0.0)), str(topk))
    assert done.returncode != 0 and "--compare needs a topk file and a dense file" in done.stderr


def test_the_recorded_scale_comparison_is_what_its_files_say() -> None:
    """bench/results' at-scale files (issue 26, part 4) give the verdict docs/results.md quotes."""
    results = REPO / "bench" / "results"
    done = _compare(
        *(str(results / f"mopd_scale_{o}_cuda.json") for o in ("topk16", "dense", "sampled"))
    )
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["met"] is True and verdict["share_of_dense"]["lookup"] == 1.0
    assert verdict["share_of_dense"]["calculator"] >= 0.95 and verdict["swapped_max"] <= 0.1
