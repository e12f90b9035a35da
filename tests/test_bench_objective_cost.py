"""bench/mopd_objective_cost.py at tiny sizes on CPU: every objective runs through the trainer's
path, dense is refused where its estimate does not fit, and the last line is the JSON verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration

VERDICT_KEYS = {"metric", "unit", "baseline", "ours", "ratio", "target", "met"}


def test_every_objective_runs_and_the_last_line_is_the_verdict(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    # dense needs 2 x L x V x 4 bytes: 65,536 at L=16 and 32,768 at the sweep's V=256 fit in
    # --free-gb 1e-4 (100,000 bytes); 131,072 at L=32 does not
    done = subprocess.run(
        [
            sys.executable,
            "bench/mopd_objective_cost.py",
            *("--device", "cpu", "--vocab", "512", "--hidden", "64", "--layers", "1"),
            *("--lengths", "16,32", "--prompt", "8", "--topk", "4,1", "--repeats", "1"),
            *("--sweep-vocabs", "256", "--free-gb", "1e-4", "--out", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert VERDICT_KEYS <= verdict.keys()
    assert verdict["unit"] == "ms" and verdict["target"] == 1.15
    assert isinstance(verdict["met"], bool)
    assert verdict["baseline"] > 0 and verdict["ours"] > 0
    assert verdict["ratio"] == pytest.approx(verdict["ours"] / verdict["baseline"], rel=1e-3)
    assert verdict["dense"]["status"].startswith("refused: would need")

    saved = json.loads(out.read_text())
    assert saved["verdict"] == verdict
    assert saved["command"].startswith("python bench/mopd_objective_cost.py --device cpu")
    status = {(r["vocab"], r["length"], r["objective"]): r["status"] for r in saved["rows"]}
    assert status == {
        (512, 16, "sampled"): "ok",
        (512, 16, "topk4"): "ok",
        (512, 16, "topk1"): "ok",
        (512, 16, "dense"): "ok",
        (512, 32, "sampled"): "ok",
        (512, 32, "topk4"): "ok",
        (512, 32, "topk1"): "ok",
        (512, 32, "dense"): status[(512, 32, "dense")],
        (256, 16, "sampled"): "ok",
        (256, 16, "topk4"): "ok",
        (256, 16, "dense"): "ok",
    }
    assert status[(512, 32, "dense")].startswith("refused")
    rows = {(r["vocab"], r["length"], r["objective"]): r for r in saved["rows"]}
    # the same model stands for the teacher: the top-k pass scores the sampled tokens as the
    # sampled pass does
    assert all(r["teacher_gap"] < 1e-4 for key, r in rows.items() if key[2].startswith("topk"))
    # what the teacher pass keeps: R floats, R (2K + 2) values, R x V floats (+ R)
    assert rows[(512, 16, "sampled")]["kept_mb"] == pytest.approx(16 * 4 / 1e6, abs=1e-4)
    assert rows[(512, 16, "dense")]["kept_mb"] == pytest.approx(16 * 513 * 4 / 1e6, abs=1e-4)
    assert saved["vocab_sweep"]["vocab"] == [256, 512]
    dense_kept = [entry["kept_mb"] for entry in saved["vocab_sweep"]["dense"]]
    assert dense_kept[1] == pytest.approx(2 * dense_kept[0], rel=1e-2)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["bench/mopd_objective_cost.py", "--backend", "slime"],
            "--backend slime: no CUDA device: slime's Megatron actor runs on a GPU",
        ),
        (["bench/teacher_rotation_slime.py"], "bench/teacher_rotation_slime.py: no CUDA device"),
    ],
)
def test_the_benches_through_slime_say_what_they_need(argv: list[str], says: str) -> None:
    """Through slime's Megatron actor the benches need a GPU (and slime, Megatron-LM); without
    one they stop with one sentence naming what is missing."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("SLIME_ROOT", "MEGATRON_LM_ROOT")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert says in done.stderr


def test_the_rotation_bench_skips_a_shape_the_gpu_cannot_train() -> None:
    """bench/teacher_rotation_slime.py counts a shape's parameters as Megatron built them (the
    4B shape measured 4,022,468,096 on the GPU) and skips, with one sentence, a shape whose
    training states and an 8k-token step do not fit the card (4B on an 80 GB H100 ran out of
    memory in every case)."""
    sys.path.insert(0, str(REPO / "bench"))
    import teacher_rotation_slime as bench

    assert bench.parameters(bench.shapes()["qwen3-4b"]) == 4_022_468_096
    h100, h200 = 79.18 * 2**30, 139.8 * 2**30
    assert bench.does_not_fit("qwen3-0.6b", h100) is None
    assert bench.does_not_fit("qwen3-4b", h200) is None
    why = bench.does_not_fit("qwen3-4b", h100)
    assert why is not None and "needs about 96 GB" in why and "this GPU has 85 GB" in why
