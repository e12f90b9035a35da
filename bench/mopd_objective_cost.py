"""Benchmark: what each MOPD objective costs, teacher pass plus loss step, in time and memory.

    .venv/bin/python bench/mopd_objective_cost.py                  # CPU, tiny shapes (~1 min)
    python bench/mopd_objective_cost.py --device cuda               # one H200 (a few minutes)
    python bench/mopd_objective_cost.py --device cuda --topk 16,1,64   # also sweep K
    SLIME_ROOT=... MEGATRON_LM_ROOT=... python bench/mopd_objective_cost.py --device cuda \
        --backend slime                         # the same step through slime's Megatron actor

For the objectives ``sampled``, ``topk`` and ``dense`` (docs/mopd_objectives.md), one sample (a
prompt and a response of L tokens) goes through the embedded trainer's path:

1. the teacher pass, under no_grad (and bf16 autocast on CUDA, as the trainer with ``bf16``),
   keeps what the objective needs: ``sampled`` the ``[R]`` log-probs
   (``causal_lm_response_log_probs``), ``topk`` the ``[R]`` log-probs carrying the top-K support
   (``causal_lm_response_topk``), ``dense`` the ``[R, V]`` log-softmax
   (``causal_lm_response_log_softmax``) and the sampled-token log-probs read from it;
2. the loss step: ``compute_mopd_advantages``, the student's packed logits
   (``causal_lm_packed_logits``), ``mopd_policy_loss`` with the objective and slime's reducer
   (``get_sum_of_sample_mean``), backward through the whole model.

On CUDA the model is Qwen3-0.6B-shaped (hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim
128, intermediate 3072, tied embeddings) with Qwen3.5's 248,320-entry vocabulary (the embedding
size docs/mopd_objectives.md uses), random weights, bf16. The same model object stands for the
teacher: the embedded trainer streams each teacher into the student's buffers (TeacherBank), so
one set of weights is on the device, and the rotation's own cost is bench/teacher_rotation.py's.
Teacher and student therefore agree (losses near 0); the work done is the same.

Time: the median over ``--repeats`` rounds after a warm-up, the objectives taking turns each
round. Memory: peak allocated in each phase (the counter reset between them), the total being
the larger, from a start where the weights are the only tensors (gradients set to None, as the
trainer's ``zero_grad``). Before ``dense`` runs, its need is estimated (the ``[R, V]`` float32
teacher twice: the pass's output and the loss's packed copy, plus what ``sampled`` added at the
same case) and the case is refused when that exceeds the free memory; a CUDA out-of-memory is
reported per case. A vocabulary sweep at the shortest length shows dense growing with V while
topk stays at sampled's memory. CPU runs report time only.

``--backend slime`` times the whole MOPD step through slime's ``MegatronTrainRayActor`` with the
project's MOPD actor (tests/real_slime/gpu_step.py, in processes of their own): a Megatron
model of the same shape with Megatron's random initialisation, saved as ``torch_dist`` and
loaded as the student and as one teacher (into slime's pinned ``TensorBackuper``); then per
objective one warm-up and ``--repeats`` timed ``actor.train`` steps on one sample: the
teacher's restore and pass, the student's log-prob pass, the loss, backward and the
distributed optimizer's step, with slime's timers and the peak memory allocated. ``dense`` is
refused by the actor at launch there; its row is the refusal and the bytes it would keep.

The last line printed is the JSON verdict: topk (the first ``--topk``) against sampled at the
longest length and the main vocabulary: time <= 1.15x and peak memory <= 1.10x, both.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dressage.training.embedded.args import trainer_args  # noqa: E402
from dressage.training.log_probs import (  # noqa: E402
    causal_lm_packed_logits,
    causal_lm_response_log_probs,
    causal_lm_response_log_softmax,
)
from dressage.training.mopd_loss import compute_mopd_advantages, mopd_policy_loss  # noqa: E402
from dressage.training.mopd_topk import causal_lm_response_topk, support_of  # noqa: E402
from dressage.training.reducer import get_sum_of_sample_mean  # noqa: E402

QWEN3_5_VOCAB = 248320
TIME_TARGET, MEMORY_TARGET = 1.15, 1.10
GB = 1e9


# --- the model ---------------------------------------------------------------------------------


def build_model(vocab: int, hidden: int, layers: int, device: torch.device) -> nn.Module:
    """A Qwen3 causal LM with random weights; Qwen3-0.6B's shape at hidden 1024, 28 layers."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    heads = max(1, hidden // 64)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def autocast(device: torch.device) -> Any:
    """The trainer's ``_autocast`` with ``bf16`` on: bfloat16 on CUDA, nothing on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


# --- the teacher pass --------------------------------------------------------------------------


def teacher_pass(
    objective: str, k: int, model: nn.Module, tokens: Tensor, resp: int, args: Any
) -> dict[str, list[Tensor]]:
    """What the objective's loss needs from the teacher: ``teacher_log_probs`` (and for dense
    ``teacher_full_log_probs``), each a one-sample list, as the trainer's ``_log_probs`` keeps."""
    options = dict(temperature=args.rollout_temperature, chunk_tokens=args.log_probs_chunk_size)
    device = next(model.parameters()).device
    sample = ([tokens], [resp])
    with torch.no_grad(), autocast(device):
        if objective == "sampled":
            return {"teacher_log_probs": causal_lm_response_log_probs(model, *sample, **options)}
        if objective == "topk":
            return {"teacher_log_probs": causal_lm_response_topk(model, *sample, k, **options)}
        dists = causal_lm_response_log_softmax(model, *sample, **options)
        target = tokens[-resp:].to(device)[:, None]
        return {
            "teacher_full_log_probs": dists,
            "teacher_log_probs": [dists[0].gather(-1, target).squeeze(-1)],
        }


# --- the loss step -----------------------------------------------------------------------------


def loss_step(
    model: nn.Module, tokens: Tensor, resp: int, student: Tensor, teacher: dict, args: Any
) -> float:
    """Advantages, packed logits, ``mopd_policy_loss``, backward; returns the loss."""
    device = student.device
    masks = [torch.ones(resp, dtype=torch.int32, device=device)]
    sums = torch.tensor([float(resp)], device=device)
    rollout: dict[str, Any] = {
        "log_probs": [student],
        "loss_masks": masks,
        "total_lengths": [int(tokens.numel())],
        "response_lengths": [resp],
        "prompt": ["teacher"],
        "rollout_ids": [0],
        "rollout_mask_sums": sums,
        "raw_reward": [0.0],
        **teacher,
    }
    compute_mopd_advantages(args, rollout)
    batch: dict[str, Any] = {
        "unconcat_tokens": [tokens],
        "tokens": tokens[None].to(device),
        "total_lengths": rollout["total_lengths"],
        "response_lengths": [resp],
        "loss_masks": masks,
        "rollout_mask_sums": sums,
        "log_probs": [student],
        "advantages": rollout["advantages"],
        "returns": rollout["returns"],
        "teacher_log_probs": teacher["teacher_log_probs"],
        "teacher_full_log_probs": teacher.get("teacher_full_log_probs"),
    }
    with autocast(device):
        logits = causal_lm_packed_logits(model, [tokens])
    reducer = get_sum_of_sample_mean(batch["total_lengths"], [resp], masks, sums)
    loss, _ = mopd_policy_loss(args, batch, logits, reducer)
    loss.backward()
    return float(loss.detach())


# --- one case: an objective at (V, L) ----------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak(device: torch.device) -> float | None:
    """Peak allocated bytes since the last reset (None on CPU), then reset."""
    if device.type != "cuda":
        return None
    value = float(torch.cuda.max_memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    return value


def free_bytes(device: torch.device) -> float:
    """Memory a new tensor could take: the device's free memory plus our allocator's slack."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        slack = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return float(free + slack)
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def run_once(
    objective: str, k: int, model: nn.Module, tokens: Tensor, resp: int, student: Tensor, args: Any
) -> dict[str, Any]:
    """One teacher pass and one loss step: times (s), phase peaks (bytes) and what the pass kept."""
    device = student.device
    model.zero_grad(set_to_none=True)
    sync(device)
    peak(device)
    start = time.perf_counter()
    teacher = teacher_pass(objective, k, model, tokens, resp, args)
    sync(device)
    scored = time.perf_counter()
    teacher_peak = peak(device)
    kept = sum(kept_bytes(t) for values in teacher.values() for t in values)
    loss = loss_step(model, tokens, resp, student, teacher, args)
    sync(device)
    done = time.perf_counter()
    loss_peak = peak(device)
    return {
        "teacher_s": scored - start,
        "loss_s": done - scored,
        "teacher_peak": teacher_peak,
        "loss_peak": loss_peak,
        "kept_bytes": kept,
        "loss": loss,
    }


def kept_bytes(t: Tensor) -> int:
    """Bytes a teacher output holds: the tensor and the top-k support it may carry."""
    parts = [t]
    support = support_of(t)
    if support is not None:
        parts += [support.ids, support.log_probs, support.tail]
    return sum(x.numel() * x.element_size() for x in parts)


def release(model: nn.Module | None) -> None:
    """Drop gradients, garbage and the allocator's cached blocks (after an out-of-memory, or a
    model)."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def label(objective: str, k: int) -> str:
    return f"topk{k}" if objective == "topk" else objective


@dataclass
class Case:
    """One sample at (V, L) and what each objective measured on it."""

    model: nn.Module
    vocab: int
    length: int
    tokens: Tensor  # [prompt + L] on the CPU, as the trainer keeps them
    student: Tensor  # [L] the student's old log-probs
    resident: float | None  # bytes allocated with the weights alone (CUDA)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def attempt(self, name: str, objective: str, k: int, args: argparse.Namespace) -> None:
        """One run into ``runs[name]``; an out-of-memory drops the objective from this case."""
        failed = False
        try:
            run = run_once(objective, k, self.model, self.tokens, self.length, self.student, args)
            self.runs[name].append(run)
        except torch.OutOfMemoryError:
            failed = True
        if failed:  # past the except clause its traceback no longer holds the step's tensors
            done = len(self.runs.pop(name))
            self.rows[name]["status"] = f"out of memory (after {done} runs)"
            release(self.model)

    def dense_refusal(self, free_gb: float | None) -> str | None:
        """Why dense must not run here, or None. The estimate: the [R, V] float32 teacher twice
        (the pass's output and the loss's packed copy) plus what sampled added at this case."""
        need = 2.0 * self.length * self.vocab * 4
        sampled = self.runs.get("sampled")
        if sampled and self.resident is not None:
            need += max(max(r["teacher_peak"], r["loss_peak"]) for r in sampled) - self.resident
        device = self.student.device
        free = free_gb * GB if free_gb is not None else free_bytes(device)
        self.rows["dense"]["dense_estimate_gb"] = round(need / GB, 3)
        if need <= free:
            return None
        return f"refused: would need {need / GB:.3g} GB, {free / GB:.3g} GB free"


def measure(
    model: nn.Module,
    vocab: int,
    length: int,
    prompt: int,
    objectives: list[tuple[str, int]],
    base_args: argparse.Namespace,
    repeats: int,
    free_gb: float | None,
) -> list[dict[str, Any]]:
    """Every objective at (V, L): a warm-up each (sampled first: dense's estimate adds what
    sampled used), then ``repeats`` rounds, the objectives taking turns."""
    device = next(model.parameters()).device
    tokens = torch.randint(0, vocab, (prompt + length,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), autocast(device):
        student = causal_lm_response_log_probs(model, [tokens], [length])[0]
    resident = float(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None
    case = Case(model, vocab, length, tokens, student, resident)
    plan = {}
    for objective, k in objectives:
        name = label(objective, k)
        options = {**vars(base_args), "mopd_objective": objective, "mopd_topk": k or None}
        plan[name] = (objective, k, argparse.Namespace(**options))
        case.rows[name] = {"vocab": vocab, "length": length, "objective": name, "status": "ok"}
    check_topk_pass(case, plan)
    for name, (objective, k, args) in plan.items():
        refusal = case.dense_refusal(free_gb) if objective == "dense" else None
        if refusal:
            case.rows[name]["status"] = refusal
            continue
        case.runs[name] = []
        case.attempt(name, objective, k, args)
    for _ in range(repeats):
        for name in list(case.runs):
            case.attempt(name, *plan[name])
    model.zero_grad(set_to_none=True)
    for name, done in case.runs.items():
        case.rows[name] |= summarise(done, resident)
    return list(case.rows.values())


def check_topk_pass(case: Case, plan: dict[str, tuple[str, int, argparse.Namespace]]) -> None:
    """The top-k pass's ``log pT(y_t)`` against the sampled pass's (the same teacher, so they
    must agree to float rounding): the largest gap, kept on the topk rows as ``teacher_gap``."""
    reference = teacher_pass("sampled", 0, case.model, case.tokens, case.length, plan["sampled"][2])
    for name, (objective, k, args) in plan.items():
        if objective == "topk":
            got = teacher_pass(objective, k, case.model, case.tokens, case.length, args)
            gap = (got["teacher_log_probs"][0] - reference["teacher_log_probs"][0]).abs().max()
            case.rows[name]["teacher_gap"] = float(gap)


def summarise(done: list[dict[str, Any]], resident: float | None) -> dict[str, Any]:
    """Median times over the timed rounds (the warm-up left out); peaks over every run."""
    timed = done[1:] or done
    out: dict[str, Any] = {
        "teacher_ms": 1e3 * statistics.median(r["teacher_s"] for r in timed),
        "loss_ms": 1e3 * statistics.median(r["loss_s"] for r in timed),
        "total_ms": 1e3 * statistics.median(r["teacher_s"] + r["loss_s"] for r in timed),
        "kept_mb": done[0]["kept_bytes"] / 1e6,
        "loss": done[-1]["loss"],
    }
    if resident is not None:
        teacher = max(r["teacher_peak"] for r in done)
        loss = max(r["loss_peak"] for r in done)
        out |= {
            "teacher_peak_gb": teacher / GB,
            "loss_peak_gb": loss / GB,
            "peak_gb": max(teacher, loss) / GB,
            "above_weights_gb": (max(teacher, loss) - resident) / GB,
        }
    return {key: round(v, 4) if isinstance(v, float) else v for key, v in out.items()}


# --- report ------------------------------------------------------------------------------------


def with_ratios(rows: list[dict[str, Any]]) -> None:
    """Each measured row's time and peak memory as a multiple of sampled's at the same case."""
    for row in rows:
        base = next((r for r in rows if r["objective"] == "sampled" and _same_case(r, row)), None)
        if base is None or "total_ms" not in base or "total_ms" not in row:
            continue
        row["time_ratio"] = round(row["total_ms"] / base["total_ms"], 4)
        if "peak_gb" in row and "peak_gb" in base:
            row["memory_ratio"] = round(row["peak_gb"] / base["peak_gb"], 4)


def _same_case(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["vocab"] == b["vocab"] and a["length"] == b["length"])


def print_row(row: dict[str, Any]) -> None:
    def f(key: str, spec: str) -> str:
        value = row.get(key)
        return format(value, spec) if value is not None else "-".rjust(int(spec.split(".")[0]))

    head = f"{row['vocab']:>7} {row['length']:>6} {row['objective']:>8}"
    if "total_ms" not in row:
        print(f"{head}  {row['status']}", flush=True)
        return
    print(
        f"{head} {f('teacher_ms', '10.1f')} {f('loss_ms', '9.1f')} {f('total_ms', '9.1f')} "
        f"{f('time_ratio', '6.3f')} {f('teacher_peak_gb', '8.2f')} {f('loss_peak_gb', '8.2f')} "
        f"{f('peak_gb', '8.2f')} {f('above_weights_gb', '8.2f')} {f('memory_ratio', '6.3f')} "
        f"{f('kept_mb', '10.3f')}",
        flush=True,
    )


HEADER = (
    f"{'V':>7} {'L':>6} {'objective':>8} {'teacher ms':>10} {'loss ms':>9} {'total ms':>9} "
    f"{'x time':>6} {'teach GB':>8} {'loss GB':>8} {'peak GB':>8} {'+weights':>8} {'x mem':>6} "
    f"{'kept MB':>10}"
)


def verdict(rows: list[dict[str, Any]], vocab: int, length: int, k: int) -> dict[str, Any]:
    """topk (K = ``k``) against sampled at (``vocab``, ``length``)."""
    at = {r["objective"]: r for r in rows if r["vocab"] == vocab and r["length"] == length}
    sampled, topk, dense = at.get("sampled", {}), at.get(label("topk", k), {}), at.get("dense", {})
    time_ratio, memory_ratio = topk.get("time_ratio"), topk.get("memory_ratio")
    measured_memory = "peak_gb" in sampled
    met = (
        time_ratio is not None
        and time_ratio <= TIME_TARGET
        and (not measured_memory or (memory_ratio is not None and memory_ratio <= MEMORY_TARGET))
    )
    return {
        "metric": f"teacher pass + loss step, topk (K={k}) vs sampled, one sample of {length} "
        f"response tokens, V={vocab}",
        "unit": "ms",
        "baseline": sampled.get("total_ms"),
        "ours": topk.get("total_ms"),
        "ratio": time_ratio,
        "target": TIME_TARGET,
        "memory_unit": "GB peak allocated",
        "memory_baseline": sampled.get("peak_gb"),
        "memory_ours": topk.get("peak_gb"),
        "memory_ratio": memory_ratio,
        "memory_target": MEMORY_TARGET if measured_memory else "not measured on CPU",
        "met": bool(met),
        "dense": {
            key: dense.get(key)
            for key in (
                "status",
                "dense_estimate_gb",
                "total_ms",
                "peak_gb",
                "time_ratio",
                "memory_ratio",
            )
            if key in dense
        },
    }


def vocab_sweep(rows: list[dict[str, Any]], length: int, names: list[str]) -> dict[str, Any]:
    """Per objective, its peak (GB, CUDA) and what its teacher pass kept (MB) at each V, or why
    it did not run: how dense grows with V where topk does not."""
    vocabs = sorted({r["vocab"] for r in rows if r["length"] == length})
    out: dict[str, Any] = {"length": length, "vocab": vocabs}
    for name in names:
        at = {r["vocab"]: r for r in rows if r["length"] == length and r["objective"] == name}
        out[name] = [
            {key: at[v][key] for key in ("peak_gb", "kept_mb") if key in at[v]} or at[v]["status"]
            for v in vocabs
            if v in at
        ]
    return out


# --- main --------------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse() -> argparse.Namespace:
    """The flags, with the defaults derived from ``--device`` (CUDA: Qwen3-0.6B's shape at
    Qwen3.5's vocabulary, 2k and 8k; CPU: a tiny model for a smoke run)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--vocab", type=int, help=f"V (cuda {QWEN3_5_VOCAB}, cpu 4096)")
    parser.add_argument("--hidden", type=int, help="hidden size (cuda 1024, cpu 128)")
    parser.add_argument("--layers", type=int, help="layers (cuda 28, cpu 2)")
    parser.add_argument("--lengths", help="response tokens (cuda 2048,8192; cpu 64,128)")
    parser.add_argument("--prompt", type=int, help="prompt tokens (cuda 256, cpu 32)")
    parser.add_argument("--topk", default="16", help="K, or several to sweep (the first judged)")
    parser.add_argument("--sweep-vocabs", help="more V at --sweep-length (32768,131072)")
    parser.add_argument("--sweep-length", type=int, help="the sweep's L (the shortest length)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up")
    parser.add_argument("--free-gb", type=float, help="memory free for dense (the device's)")
    parser.add_argument("--out", help="raw JSON (bench/results/mopd_objective_cost_<device>.json)")
    parser.add_argument(
        "--backend",
        default="embedded",
        choices=["embedded", "slime"],
        help="the embedded trainer's path, or slime's Megatron actor (CUDA, SLIME_ROOT, "
        "MEGATRON_LM_ROOT)",
    )
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.vocab = args.vocab or (QWEN3_5_VOCAB if cuda else 4096)
    args.hidden = args.hidden or (1024 if cuda else 128)
    args.layers = args.layers or (28 if cuda else 2)
    args.lengths = sorted(ints(args.lengths or ("2048,8192" if cuda else "64,128")))
    args.prompt = args.prompt or (256 if cuda else 32)
    args.topk = ints(args.topk)
    args.sweep_length = args.sweep_length or args.lengths[0]
    default_sweep = [v for v in (32768, 131072) if v < args.vocab] or [
        args.vocab // 4,
        args.vocab // 2,
    ]
    args.sweep_vocabs = ints(args.sweep_vocabs) if args.sweep_vocabs else default_sweep
    suffix = "_slime" if args.backend == "slime" else ""
    args.out = args.out or str(
        REPO / f"bench/results/mopd_objective_cost{suffix}_{args.device}.json"
    )
    return args


def run_all(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Every objective at every length at the main V, then sampled, the first K and dense at
    the sweep's length for each further V; a table row per result as it comes."""
    base_args = trainer_args(
        device=args.device,
        global_batch_size=1,
        bf16=device.type == "cuda",
        loss_type="custom_loss",
        custom_loss_function_path="dressage.training.mopd_loss.mopd_policy_loss",
        custom_advantage_function_path="dressage.training.mopd_loss.compute_mopd_advantages",
    )
    every = [("sampled", 0), *[("topk", k) for k in args.topk], ("dense", 0)]
    three = [("sampled", 0), ("topk", args.topk[0]), ("dense", 0)]
    rows: list[dict[str, Any]] = []
    for vocab in [args.vocab, *[v for v in args.sweep_vocabs if v != args.vocab]]:
        model = build_model(vocab, args.hidden, args.layers, device)
        params = sum(p.numel() for p in model.parameters())
        print(
            f"\nQwen3, hidden {args.hidden}, {args.layers} layers, V {vocab}: {params / 1e6:.1f}M "
            f"parameters, {next(model.parameters()).dtype}, on {device}; prompt {args.prompt}"
        )
        print(HEADER)
        lengths = args.lengths if vocab == args.vocab else []
        for length in sorted({*lengths, args.sweep_length}):
            which = every if length in lengths else three
            case = measure(
                model, vocab, length, args.prompt, which, base_args, args.repeats, args.free_gb
            )
            with_ratios(case)
            for row in case:
                print_row(row)
            rows += case
        del model
        release(None)
    return rows


def run_slime(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each objective's whole MOPD step through slime's actor, one row per (length, objective)
    in this bench's row format (``total_ms`` the step, ``peak_gb`` its peak)."""
    import tempfile

    from tests.real_slime import gpu_step

    why = gpu_step.missing()
    if why:
        raise SystemExit(f"--backend slime: {why}")
    heads = max(1, args.hidden // 64)
    shape = dict(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
    )
    work = Path(tempfile.mkdtemp(prefix="mopd_cost_slime_"))
    hf, checkpoint = gpu_step.prepare(work, shape)
    k = args.topk[0]
    objectives = [("sampled", None), *[("topk", kk) for kk in args.topk]]
    spec = {
        "name": "cost",
        "hf": str(hf),
        "student_load": str(checkpoint),
        "teacher_load": str(checkpoint),
        "teachers": 1,
        "samples": 1,
        "prompt": args.prompt,
        "lengths": args.lengths,
        "objective": "topk",  # the actor checks the top-k options at init; cases switch
        "topk": k,
        "repeats": args.repeats,
        "cases": [
            {
                "length": length,
                "teachers": 1,
                "variants": [{"objective": obj, "topk": kk} for obj, kk in objectives],
            }
            for length in args.lengths
        ],
    }
    gpu_step.phase("measure", str(work), json.dumps(spec), log=work / "measure.log")
    report = json.loads((work / "cost.json").read_text())
    print(f"slime actor: {report['init']['parameters'] / 1e6:.1f}M parameters; work in {work}")
    rows: list[dict[str, Any]] = []
    for case in report["cases"]:
        name = label(case["objective"], case.get("topk") or 0)
        row: dict[str, Any] = {"vocab": args.vocab, "length": case["length"], "objective": name}
        if "refused" in case:
            row["status"] = case["refused"]
        else:
            row.update(
                total_ms=round(case["seconds"] * 1e3, 1),
                peak_gb=round(case["peak_bytes"] / GB, 3),
                above_weights_gb=round((case["peak_bytes"] - case["start_bytes"]) / GB, 3),
                all_ms=[round(t * 1e3, 1) for t in case["all_seconds"]],
            )
        rows.append(row)
    from dressage.training.mopd_actor import refuse_unsupported_objective

    for length in args.lengths:
        try:
            refuse_unsupported_objective(argparse.Namespace(mopd_objective="dense"))
            status = "dense ran"  # never: the actor refuses it
        except ValueError as exc:
            need = args.vocab * 4 * length / GB
            status = f"refused at launch ({need:.1f} GB a sample kept): {exc}"
        rows.append({"vocab": args.vocab, "length": length, "objective": "dense", "status": status})
    print(HEADER)
    for length in args.lengths:
        case_rows = [r for r in rows if r["length"] == length]
        with_ratios(case_rows)
        for row in case_rows:
            print_row(row)
    return rows


def main() -> None:
    args = parse()
    device = torch.device(args.device)
    command = " ".join(["python", "bench/mopd_objective_cost.py", *sys.argv[1:]])
    print(command)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        print(f"device: {name}, {free_bytes(device) / GB:.1f} GB free")
    torch.manual_seed(0)
    started = time.perf_counter()
    rows = run_slime(args) if args.backend == "slime" else run_all(args, device)
    names = ["sampled", label("topk", args.topk[0]), "dense"]
    sweep = vocab_sweep(rows, args.sweep_length, names) if args.backend == "embedded" else {}
    if sweep:
        print(f"\nby vocabulary at L={args.sweep_length}: {json.dumps(sweep)}")
    summary = verdict(rows, args.vocab, args.lengths[-1], args.topk[0])
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["backend"] = args.backend
    if args.backend == "slime":
        summary["metric"] = summary["metric"].replace(
            "teacher pass + loss step", "whole MOPD step through slime's Megatron actor"
        )
    record = {
        "command": command,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "settings": {
            key: getattr(args, key)
            for key in (
                "backend",
                "vocab",
                "hidden",
                "layers",
                "lengths",
                "prompt",
                "topk",
                "repeats",
            )  # fmt: skip
        },
        "rows": rows,
        "vocab_sweep": sweep,
        "verdict": summary,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    shown = out.resolve().relative_to(REPO) if out.resolve().is_relative_to(REPO) else out.name
    print(f"raw results: {shown}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
