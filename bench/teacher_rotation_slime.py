"""Benchmark: teacher rotation through slime's own TensorBackuper, against resident teachers.

    SLIME_ROOT=... MEGATRON_LM_ROOT=... python bench/teacher_rotation_slime.py    # one GPU

The MOPD step runs through slime's ``MegatronTrainRayActor`` with the project's MOPD actor
(tests/real_slime/gpu_step.py, one process per model shape): Megatron models with real Megatron
layers and Megatron's random initialisation in bf16, Qwen3-0.6B- and Qwen3-4B-shaped (Qwen3's
151,936-entry vocabulary, tied embeddings). The student and four teachers are loaded at
``init``, each teacher from ``torch_dist`` into slime's ``TensorBackuper`` in pinned host memory.

Each step trains on four samples of a 256-token prompt and a response of 2k or 8k tokens, spread
over 1, 2 or 4 teachers (the same work in every case), sampled objective:

* rotate (ours): the actor as it runs: each teacher restored from pinned memory onto the
  student's buffers for its pass, the student restored after, each restore streamed layer by
  layer under the pass that needs it (``--mopd-restore streamed``), and no restore of the
  student that the weights already hold;
* rotate-slime: the same, every switch through slime's own ``_switch_model`` (its
  ``TensorBackuper.restore``, whole before each pass), as ``--mopd-restore slime`` runs;
* resident (baseline): the teachers' weights copied to the GPU beforehand, as resident teachers
  would hold them (where they fit), and no restore: every pass runs on the weights in place.

Time is the median ``actor.train`` step (CUDA synchronised) over the timed rounds after a
warm-up, the three taking turns in each round; memory is the peak allocated in the
step. Pinned memory is the bytes of the backuper's pinned tensors after each teacher's load
(torch's host-allocator counter read 0 for them on the GPU machine's torch 2.11).

The 4B model trains with full recomputation, to fit an 8k-token step beside Adam's states on
one 80 GB card (the same in both placements). Where the resident teachers' copies do not fit
beside it, the resident time is still measured (the passes' work does not depend on where the
weights live) and the row says they do not fit.

The last line is the JSON verdict: rotate against resident at 4B, 8k-token responses, 2
teachers (the case of the earlier restore-then-score figure, 1.127x); target 1.10x. GPU memory
must stay flat in the number of teachers and pinned memory grow linearly; both are in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET = 1.10
MODES = ("resident", "rotate-slime", "rotate")
GB = 1e9
QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
)
"""Qwen3-0.6B's shape (0.60B parameters with tied embeddings)."""


def shapes() -> dict[str, dict[str, Any]]:
    """The shapes measured: Qwen3-0.6B's, and Qwen3-4B's from bench/teacher_rotation.py."""
    sys.path.insert(0, str(REPO / "bench"))
    from teacher_rotation import SHAPES

    return {"qwen3-0.6b": QWEN3_0_6B, "qwen3-4b": SHAPES["qwen3-4b"]}


FIT_ON_ONE_CARD: dict[str, dict[str, Any]] = {
    "qwen3-4b": {
        "extra": [
            "--recompute-granularity", "full",
            "--recompute-method", "uniform",
            "--recompute-num-layers", "1",
        ],
    },
}  # fmt: skip


TRAIN_BYTES_PER_PARAMETER = 18
"""What training holds per parameter before activations: bf16 weights (2), the float32 gradient
buffer (4) and main parameters (4), Adam's two float32 moments (8)."""
ACTIVATION_HEADROOM = 24e9
"""Bytes left for the step's activations and logits at 8k tokens (4B measured: 72 GB of states
did not fit beside them on an 80 GB H100). Shorter responses do not bring 4B onto that card: at
2k tokens its step ran out of memory there too, with 75.6 GiB allocated."""


def parameters(shape: dict[str, Any]) -> int:
    """Parameters of a Qwen3-shaped model with tied embeddings."""
    hidden, heads, kv = (
        shape["hidden_size"],
        shape["num_attention_heads"],
        shape["num_key_value_heads"],
    )
    head_dim = shape.get("head_dim", hidden // heads)
    attention = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden + 2 * head_dim
    mlp = 3 * hidden * shape["intermediate_size"]
    layer = attention + mlp + 2 * hidden
    return shape["vocab_size"] * hidden + shape["num_hidden_layers"] * layer + hidden


def does_not_fit(name: str, total_bytes: int) -> str | None:
    """Why the shape cannot train on a GPU of ``total_bytes`` (None when it can)."""
    need = parameters(shapes()[name]) * TRAIN_BYTES_PER_PARAMETER + ACTIVATION_HEADROOM
    if need <= total_bytes:
        return None
    return (
        f"{name}: training it needs about {need / GB:.0f} GB (weights, gradients, main parameters "
        f"and Adam's moments at {TRAIN_BYTES_PER_PARAMETER} bytes a parameter, and "
        f"{ACTIVATION_HEADROOM / GB:.0f} GB for an 8k-token step) and this GPU has "
        f"{total_bytes / GB:.0f} GB: run it on a larger one (an H200 has 141 GB)"
    )


def measure_shape(
    name: str, work: Path, lengths: list[int], counts: list[int], repeats: int, prompt: int
) -> dict[str, Any]:
    from tests.real_slime import gpu_step

    work.mkdir(parents=True, exist_ok=True)
    hf, checkpoint = gpu_step.prepare(work, shapes()[name])
    spec = {
        "name": "rotation",
        "hf": str(hf),
        "student_load": str(checkpoint),
        "teacher_load": str(checkpoint),
        "teachers": max(counts),
        "samples": max(counts),
        "prompt": prompt,
        "lengths": lengths,
        "objective": "sampled",
        "repeats": repeats,
        "cases": [
            {"length": length, "teachers": n, "variants": [{"mode": m} for m in MODES]}
            for length in lengths
            for n in counts
        ],
        **FIT_ON_ONE_CARD.get(name, {}),
    }
    gpu_step.phase("measure", str(work), json.dumps(spec), log=work / "measure.log")
    report = json.loads((work / "rotation.json").read_text())
    if "error" in report:
        raise RuntimeError(report["error"])
    return report


def table(name: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    init = report["init"]
    print(
        f"\n{name}: {init['parameters'] / 1e9:.2f}B parameters, {init['model_bytes'] / GB:.2f} GB "
        f"in bf16; pinned backups after each teacher's load (GB): "
        f"{[round(b / GB, 2) for b in init['backup_pinned_bytes_after_each_load']]}"
    )
    print(f"{'L':>6} {'teachers':>8} {'mode':>12} {'step s':>8} {'x resident':>10} {'peak GB':>8}")
    rows = []
    for case in report["cases"]:
        row = {"shape": name, **case}
        base = next(
            (
                c
                for c in report["cases"]
                if c["mode"] == "resident"
                and c["length"] == case["length"]
                and c["teachers"] == case["teachers"]
            ),
            None,
        )
        if base and "seconds" in base and "seconds" in case:
            row["ratio"] = round(case["seconds"] / base["seconds"], 4)
        seconds = f"{case['seconds']:8.3f}" if "seconds" in case else f"{'-':>8}"
        ratio = f"{row['ratio']:10.3f}" if "ratio" in row else f"{'-':>10}"
        peak = f"{case['peak_bytes'] / GB:8.2f}" if "peak_bytes" in case else f"{'-':>8}"
        note = case.get("resident_note") or case.get("refused") or ""
        print(
            f"{case['length']:>6} {case['teachers']:>8} {case['mode']:>12} {seconds} {ratio} "
            f"{peak} {note[:90]}",
            flush=True,
        )
        rows.append(row)
    return rows


def linear(pinned: list[int]) -> dict[str, Any]:
    """How the pinned backups grew from one teacher's load to the next: the mean step and the
    largest step's deviation from it (0 for exactly linear growth)."""
    if len(pinned) < 2:
        return {"measured": False}
    steps = [b - a for a, b in zip(pinned, pinned[1:], strict=False)]
    mean = statistics.mean(steps)
    return {
        "measured": True,
        "gb_per_teacher": round(mean / GB, 3),
        "max_deviation": round(max(abs(s - mean) for s in steps) / mean, 4) if mean else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="qwen3-0.6b,qwen3-4b")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--teachers", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=4, help="timed rounds after a warm-up")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--out", default=str(REPO / "bench/results/teacher_rotation_slime.json"))
    args = parser.parse_args()
    from tests.real_slime import gpu_step

    command = " ".join(["python", "bench/teacher_rotation_slime.py", *sys.argv[1:]])
    print(command)
    why = gpu_step.missing()
    if why:
        raise SystemExit(f"bench/teacher_rotation_slime.py: {why}")
    import torch

    print(f"device: {torch.cuda.get_device_name(0)}")
    lengths = [int(x) for x in args.lengths.split(",")]
    counts = [int(x) for x in args.teachers.split(",")]
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rotation_slime_"))
    reports, rows, skipped = {}, [], {}
    total = torch.cuda.get_device_properties(0).total_memory
    for name in args.shapes.split(","):
        why = does_not_fit(name, total)
        if why:
            print(f"\nskipped {why}", flush=True)
            skipped[name] = why
            continue
        reports[name] = measure_shape(name, work / name, lengths, counts, args.repeats, args.prompt)
        rows += table(name, reports[name])
    judged = "qwen3-4b" if "qwen3-4b" in reports else next(iter(reports))
    at = {
        (r["mode"], r["teachers"]): r
        for r in rows
        if r["shape"] == judged and r["length"] == max(lengths)
    }
    n = 2 if 2 in counts else counts[0]
    base, ours = at.get(("resident", n), {}), at.get(("rotate", n), {})
    plain = at.get(("rotate-slime", n), {})
    rotate_peaks = {
        name: [r["peak_bytes"] for r in rows if r["shape"] == name and r["mode"] == "rotate"
               and r["length"] == max(lengths) and "peak_bytes" in r]
        for name in reports
    }  # fmt: skip
    summary = {
        "metric": f"MOPD step through slime's actor, rotate vs resident, {judged}, "
        f"{max(lengths)}-token responses, {n} teachers",
        "unit": "s",
        "baseline": base.get("seconds"),
        "ours": ours.get("seconds"),
        "ratio": ours.get("ratio"),
        "target": TARGET,
        "met": bool(ours.get("ratio") is not None and ours["ratio"] <= TARGET),
        "resident_fits": base.get("resident_fits"),
        "slime_restore_seconds": plain.get("seconds"),
        "slime_restore_ratio": plain.get("ratio"),
        "gpu_peak_spread_over_teachers": {
            name: round((max(p) - min(p)) / max(p), 4) if p else None
            for name, p in rotate_peaks.items()
        },
        "pinned_growth": {
            name: linear(rep["init"]["backup_pinned_bytes_after_each_load"])
            for name, rep in reports.items()
        },
        "skipped": skipped,
        "seconds": round(time.perf_counter() - started, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": command, "device": torch.cuda.get_device_name(0), "rows": rows}
    record["reports"] = {k: {"init": v["init"]} for k, v in reports.items()}
    record["verdict"] = summary
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
