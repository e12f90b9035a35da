"""Benchmark: validating segment tables, and Parquet throughput through fsspec.

    .venv/bin/python bench/schemas.py            # full size: 10,000 segments x 8,192 tokens
    .venv/bin/python bench/schemas.py --segments 1000 --tokens 1024   # quick

Ours: ``validate_table("segments", ...)`` (the pandera polars model, every rule) over the whole
batch, in a fresh process whose peak RSS is reset right before validation, so the memory figure
is what validation itself needs on top of the loaded Arrow data. Baseline: a plain Python per-row
check of the same rules, timed on a slice of the same batch (its cost is linear in tokens).
Targets: >= 20x the baseline, >= 200 M tokens/s, peak memory <= 2x the Arrow data.
The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

VOCAB = 248_077
FINISH = {"stop", "length", "tool_calls", "segment_boundary", "abort"}


def make_table(n_segments: int, n_tokens: int, seed: int = 0) -> pa.Table:
    from dressage.schemas.arrow import SEGMENT_SCHEMA

    rng = np.random.default_rng(seed)
    total = n_segments * n_tokens
    offsets = pa.array(np.arange(0, total + 1, n_tokens, dtype=np.int32))
    prompt = 256 if n_tokens > 512 else n_tokens // 4
    mask = rng.integers(0, 2, total, dtype=np.int8).reshape(n_segments, n_tokens)
    mask[:, :prompt] = 0
    logprobs = np.where(mask == 1, -rng.random(mask.shape, dtype=np.float32) * 5, 0.0)
    versions = np.where(mask == 1, 0, -1).astype(np.int32)
    sessions = [f"session-{i // 4:06d}" for i in range(n_segments)]
    columns = {
        "session_id": pa.array(sessions),
        "segment_index": pa.array(np.arange(n_segments) % 4, pa.int32()),
        "tokens": pa.ListArray.from_arrays(offsets, rng.integers(0, VOCAB, total, dtype=np.int32)),
        "full_loss_mask": pa.ListArray.from_arrays(offsets, mask.ravel()),
        "full_logprobs": pa.ListArray.from_arrays(offsets, logprobs.astype(np.float32).ravel()),
        "full_versions": pa.ListArray.from_arrays(offsets, versions.ravel()),
        "prompt_length": pa.array(np.full(n_segments, prompt), pa.int32()),
        "finish_reason": pa.array(["stop"] * n_segments),
        "messages_json": pa.array(["[]"] * n_segments),
        "extra_info_json": pa.array(["{}"] * n_segments),
    }
    return pa.Table.from_pydict(columns, schema=SEGMENT_SCHEMA)


def python_check(table: pa.Table, vocab_size: int) -> int:
    """The same rules, row by row in plain Python; returns the number of failing rows."""
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    failing = 0
    per_session: dict[str, list[int]] = {}
    for i in range(table.num_rows):
        per_session.setdefault(cols["session_id"][i], []).append(cols["segment_index"][i])
    contiguous = {s: sorted(v) == list(range(len(v))) for s, v in per_session.items()}
    for i in range(table.num_rows):
        tokens, mask = cols["tokens"][i], cols["full_loss_mask"][i]
        logprobs, versions = cols["full_logprobs"][i], cols["full_versions"][i]
        n, prompt = len(tokens), cols["prompt_length"][i]
        ok = len(mask) == n and len(logprobs) == n and (versions is None or len(versions) == n)
        ok = ok and all(m in (0, 1) for m in mask)
        ok = ok and all(math.isfinite(x) and x <= 0.0 for x in logprobs)
        ok = ok and all(0 <= t < vocab_size for t in tokens)
        ok = ok and prompt <= n and not any(mask[:prompt])
        ok = ok and cols["finish_reason"][i] in FINISH and cols["segment_index"][i] >= 0
        ok = ok and bool(cols["session_id"][i]) and contiguous[cols["session_id"][i]]
        failing += not ok
    return failing


_CHILD = """
import json, sys, time, pyarrow as pa
from dressage.schemas import validate_table
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
before = status("VmRSS:")
raw = pa.py_buffer(open(sys.argv[1], "rb").read())   # anonymous memory, not a file mapping
table = pa.ipc.open_file(pa.BufferReader(raw)).read_all()
validate_table("segments", table.slice(0, 8), vocab_size=int(sys.argv[2]))   # warm imports
loaded = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")   # reset the peak (VmHWM) to the current RSS
times = []
for _ in range(3):
    t = time.perf_counter()
    report = validate_table("segments", table, vocab_size=int(sys.argv[2]))
    times.append(time.perf_counter() - t)
peak = status("VmHWM:")
print(json.dumps({"seconds": min(times), "ok": report.ok, "nbytes": table.nbytes,
                  "rss_before": before, "rss_loaded": loaded, "peak": peak}))
"""


def run_ours(table: pa.Table, workdir: Path) -> dict[str, float]:
    path = workdir / "segments.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(VOCAB)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def parquet_throughput(table: pa.Table, workdir: Path) -> dict[str, float]:
    from dressage.staging import ArtifactWriter, open_artifact

    url = f"file://{workdir}/artifact"
    t = time.perf_counter()
    with ArtifactWriter(url) as w:
        entry = w.write_table("segments", table)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    back = open_artifact(url).read_table("segments")
    read_s = time.perf_counter() - t
    assert back.num_rows == table.num_rows
    mb = table.nbytes / 1e6
    return {
        "arrow_mb": round(mb, 1),
        "parquet_mb": round(entry.bytes / 1e6, 1),
        "write_mb_s": round(mb / write_s, 1),
        "read_verified_mb_s": round(mb / read_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segments", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=8_192)
    parser.add_argument("--baseline-segments", type=int, default=400)
    args = parser.parse_args()

    table = make_table(args.segments, args.tokens)
    tokens = args.segments * args.tokens
    print(f"table: {args.segments} segments x {args.tokens} tokens, {table.nbytes / 1e6:.0f} MB")

    sub = table.slice(0, min(args.baseline_segments, args.segments))
    t = time.perf_counter()
    assert python_check(sub, VOCAB) == 0
    base_s = time.perf_counter() - t
    baseline = sub.num_rows * args.tokens / base_s
    print(f"baseline (plain Python, {sub.num_rows} segments): {baseline / 1e6:.2f} M tokens/s")

    with tempfile.TemporaryDirectory() as tmp:
        ours_run = run_ours(table, Path(tmp))
        assert ours_run["ok"], "the generated table must be valid"
        ours = tokens / ours_run["seconds"]
        extra = ours_run["peak"] - ours_run["rss_loaded"]
        peak_ratio = (ours_run["peak"] - ours_run["rss_before"]) / ours_run["nbytes"]
        print(
            f"ours (pandera polars): {ours_run['seconds']:.3f} s, {ours / 1e6:.0f} M tokens/s, "
            f"validation adds {extra / 1e6:.0f} MB at peak; peak / data = {peak_ratio:.2f}"
        )
        io = parquet_throughput(table, Path(tmp))
        print(f"parquet via fsspec (local, zstd, sha256 verified): {io}")

    ratio = ours / baseline
    met = ratio >= 20 and ours >= 200e6 and peak_ratio <= 2.0
    print(
        json.dumps(
            {
                "metric": "segment table validation throughput (10k x 8192 tokens)",
                "unit": "tokens/s",
                "baseline": round(baseline),
                "ours": round(ours),
                "ratio": round(ratio, 1),
                "target": ">= 20x baseline, >= 200M tokens/s, peak memory <= 2x Arrow data",
                "met": met,
                "peak_memory_over_data": round(peak_ratio, 2),
                **io,
            }
        )
    )


if __name__ == "__main__":
    main()
