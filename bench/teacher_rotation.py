"""Benchmark: teacher rotation through one model's buffers, against resident teachers.

    .venv/bin/python bench/teacher_rotation.py                    # CPU, small shapes (~1 min)
    python bench/teacher_rotation.py --device cuda --out bench/results/teacher_rotation_cuda.json

On CUDA the model is Qwen3-4B-shaped (36 layers, hidden 2560, vocab 151936, tied embeddings:
398 tensors, 8.0 GB in bf16), built from a ``Qwen3Config`` with random weights (no download).

1. Restore: ``TeacherBank.restore`` (per-tensor ``copy_`` from pinned host memory, slime's
   pattern) against a flat copy of the same bytes in one transfer, measured in the same run
   (the machine's pinned host-to-device bandwidth), and against pageable memory.
   Floor: restore >= 95% of the flat copy.
2. Scoring with 2 teachers, at a short batch (transfer-bound) and a realistic one:
   * resident: each teacher in its own GPU model (3 models of memory), no transfer;
   * sequential (baseline): restore the whole teacher, score, next, restore the student;
   * streamed (ours): the next model streams in layer by layer behind the current model's last
     micro-batch (dressage.training.weight_streaming).
   Target: streamed <= 1.05x resident at the realistic batch. Every method's log-probs are
   compared with the resident ones.

The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dressage.training.log_probs import causal_lm_response_log_probs  # noqa: E402
from dressage.training.teacher_rotation import TeacherBank, plan_micro_batches  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-4B: 4.02B parameters, 398 tensors with tied embeddings
    "qwen3-4b": dict(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "qwen3-1.7b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "small": dict(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
}


def build_model(shape: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A Qwen3 causal LM of the given shape with random weights, built on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1e6
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def randomize(model: nn.Module, seed: int) -> None:
    """Fresh random weights in place (norm weights near 1, matrices ~N(0, 0.02))."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=p.device))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen, device=p.device))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` runs (after one warm-up), and the last result."""
    result = fn()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best, result


def bandwidth(bank: TeacherBank, device: torch.device, repeats: int) -> dict[str, float]:
    nbytes = bank.nbytes("t1")
    flat = bank.flat("t1")
    if device.type == "cuda":
        target = torch.empty(flat.numel(), dtype=torch.uint8, device=device)
        flat_s, _ = timed(lambda: target.copy_(flat, non_blocking=True), device, repeats)
        pageable = torch.ones(min(flat.numel(), 2 << 30), dtype=torch.uint8)
        page_s, _ = timed(lambda: target[: pageable.numel()].copy_(pageable), device, repeats)
        page_gbps = pageable.numel() / page_s / 1e9
        del target
    else:
        target = torch.empty_like(flat)
        flat_s, _ = timed(lambda: target.copy_(flat), device, repeats)
        page_gbps = 0.0  # no host-to-device copy on CPU
        del target

    def restore() -> None:
        bank.restore("t1")

    restore_s, _ = timed(restore, device, repeats)
    bank.restore(bank.student_tag)
    sync(device)
    return {
        "flat_gbps": flat.numel() / flat_s / 1e9,
        "restore_gbps": nbytes / restore_s / 1e9,
        "restore_ms": restore_s * 1e3,
        "restore_vs_flat": (nbytes / restore_s) / (flat.numel() / flat_s),
        "pageable_gbps": page_gbps,
    }


def make_batch(
    per_teacher: int, length: int, vocab: int, seed: int
) -> tuple[list[torch.Tensor], list[int], list[str]]:
    gen = torch.Generator().manual_seed(seed)
    tokens, resp, tags = [], [], []
    for i in range(2 * per_teacher):
        total = max(8, int(length * (0.75 + 0.5 * torch.rand((), generator=gen).item())))
        tokens.append(torch.randint(0, vocab, (total,), generator=gen))
        resp.append(total // 2)
        tags.append("t1" if i % 2 == 0 else "t2")
    return tokens, resp, tags


def score_resident(
    models: dict[str, nn.Module],
    tokens: list[torch.Tensor],
    resp: list[int],
    tags: list[str],
    max_tokens: int,
) -> list[torch.Tensor]:
    out: list[torch.Tensor] = [torch.zeros(0)] * len(tokens)
    with torch.no_grad():
        for tag, model in models.items():
            mine = [i for i, t in enumerate(tags) if t == tag]
            for mb in plan_micro_batches([tokens[i].numel() for i in mine], max_tokens):
                positions = [mine[j] for j in mb]
                scored = causal_lm_response_log_probs(
                    model, [tokens[i] for i in positions], [resp[i] for i in positions]
                )
                for i, lp in zip(positions, scored, strict=True):
                    out[i] = lp
    return out


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def mean_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    total = sum(float((x.float() - y.float()).abs().sum()) for x, y in zip(a, b, strict=True))
    return total / max(1, sum(x.numel() for x in a))


def scoring(
    bank: TeacherBank,
    resident: dict[str, nn.Module],
    batch: tuple[list[torch.Tensor], list[int], list[str]],
    max_tokens: int,
    device: torch.device,
    repeats: int,
) -> dict[str, float]:
    """Best time per method; methods take turns in every round so load drift hits all alike."""
    tokens, resp, tags = batch
    methods: dict[str, Callable[[], list[torch.Tensor]]] = {
        "resident": lambda: score_resident(resident, tokens, resp, tags, max_tokens),
        "sequential": lambda: bank.score(tokens, resp, tags, max_tokens=max_tokens, overlap=False),
        "streamed": lambda: bank.score(tokens, resp, tags, max_tokens=max_tokens, overlap=True),
    }
    outputs = {name: fn() for name, fn in methods.items()}  # warm-up, and the values to compare
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(repeats):
        for name, fn in methods.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            best[name] = min(best[name], time.perf_counter() - start)
    ref = outputs["resident"]
    return {
        "tokens": float(sum(t.numel() for t in tokens)),
        "resident_s": best["resident"],
        "sequential_s": best["sequential"],
        "streamed_s": best["streamed"],
        "sequential_ratio": best["sequential"] / best["resident"],
        "streamed_ratio": best["streamed"] / best["resident"],
        "max_logprob_diff": max(
            max_diff(ref, outputs["sequential"]), max_diff(ref, outputs["streamed"])
        ),
        # streamed against sequential isolates the overlap from batching/bf16 numerics
        "streamed_vs_sequential_max": max_diff(outputs["sequential"], outputs["streamed"]),
        "sequential_vs_resident_mean": mean_diff(ref, outputs["sequential"]),
        "streamed_vs_resident_mean": mean_diff(ref, outputs["streamed"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES))
    parser.add_argument("--short", default=None, help="per-teacher samples x tokens, e.g. 8x128")
    parser.add_argument("--real", default=None, help="per-teacher samples x tokens, e.g. 32x2048")
    parser.add_argument("--max-tokens", type=int, default=None, help="padded tokens/micro-batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    args = parser.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    shape = args.shape or ("qwen3-4b" if cuda else "small")
    dtype = torch.bfloat16 if cuda else torch.float32
    short = args.short or ("8x128" if cuda else "4x32")
    real = args.real or ("32x2048" if cuda else "8x256")
    max_tokens = args.max_tokens or (16384 if cuda else 1024)
    torch.manual_seed(0)

    start = time.perf_counter()
    model = build_model(shape, device, dtype)
    params = list(model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params)
    print(f"model: {shape}, {len(params)} tensors, {nbytes / 1e9:.2f} GB {dtype}, on {device}")
    bank = TeacherBank(model)
    resident: dict[str, nn.Module] = {}
    for k, tag in enumerate(("t1", "t2"), start=1):
        randomize(model, seed=k)
        bank.backup(tag)
        resident[tag] = build_model(shape, device, dtype)
        with torch.no_grad():
            for (_, dst), src in zip(resident[tag].named_parameters(), params, strict=True):
                dst.copy_(src)
    bank.restore(bank.student_tag)
    sync(device)
    print(f"setup: {time.perf_counter() - start:.1f} s (3 pinned host copies, 2 resident)")

    bw = bandwidth(bank, device, max(args.repeats, 5))
    print(
        f"restore (per tensor, pinned): {bw['restore_gbps']:.1f} GB/s, {bw['restore_ms']:.0f} ms"
        f" | flat copy: {bw['flat_gbps']:.1f} GB/s | pageable: {bw['pageable_gbps']:.1f} GB/s"
        f" | restore / flat = {bw['restore_vs_flat']:.3f} (floor 0.95)"
    )
    results = {}
    for name, spec in (("short", short), ("realistic", real)):
        per_teacher, length = (int(x) for x in spec.lower().split("x"))
        batch = make_batch(per_teacher, length, SHAPES[shape]["vocab_size"], seed=7)
        r = scoring(bank, resident, batch, max_tokens, device, args.repeats)
        results[name] = r
        print(
            f"{name} batch ({spec} per teacher, {int(r['tokens'])} tokens): resident "
            f"{r['resident_s'] * 1e3:.1f} ms | sequential {r['sequential_s'] * 1e3:.1f} ms "
            f"({r['sequential_ratio']:.3f}x) | streamed {r['streamed_s'] * 1e3:.1f} ms "
            f"({r['streamed_ratio']:.3f}x) | max |dlogp| {r['max_logprob_diff']:.2e} "
            f"(streamed vs sequential {r['streamed_vs_sequential_max']:.2e}; mean vs resident "
            f"{r['sequential_vs_resident_mean']:.2e} / {r['streamed_vs_resident_mean']:.2e})"
        )
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 1e9
        print(f"peak GPU memory (bank model + 2 resident models + activations): {peak:.1f} GB")
    realistic = results["realistic"]
    summary = {
        "metric": "scoring 2 teachers by rotation / teachers resident on the device (realistic)",
        "unit": "s",
        "baseline": round(realistic["resident_s"], 4),
        "ours": round(realistic["streamed_s"], 4),
        "ratio": round(realistic["streamed_ratio"], 4),
        "target": "<= 1.05x resident (realistic batch); restore >= 0.95x flat pinned copy",
        # the 95% floor is about host-to-device DMA; on CPU there is none to measure
        # ...and streaming must score exactly what the sequential restore scores
        "met": realistic["streamed_ratio"] <= 1.05
        and (bw["restore_vs_flat"] >= 0.95 or not cuda)
        and max(r["streamed_vs_sequential_max"] for r in results.values()) <= 1e-3,
        "device": str(device),
        "shape": shape,
        "tensors": len(params),
        "model_gb": round(nbytes / 1e9, 3),
        "sequential_s": round(realistic["sequential_s"], 4),
        "sequential_ratio": round(realistic["sequential_ratio"], 4),
        "short_resident_s": round(results["short"]["resident_s"], 4),
        "short_streamed_ratio": round(results["short"]["streamed_ratio"], 4),
        "short_sequential_ratio": round(results["short"]["sequential_ratio"], 4),
        **{k: round(v, 4) for k, v in bw.items()},
    }
    bank.close()
    line = json.dumps(summary)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
