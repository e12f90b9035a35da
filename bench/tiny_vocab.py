"""Where a tiny model's time goes: the real Qwen3.5 vocabulary against the small task vocabulary.

    .venv/bin/python bench/tiny_vocab.py [--steps 8] [--batch 8] [--threads 2] [--out FILE]

The same tiny Qwen3 architecture (the embedded default's: hidden 64, 2 layers), the same seed,
the same 8 ideal agent transcripts of the two tasks (each tokenized by its own tokenizer through
the proxy's TITO), two vocabularies:

- baseline: the real Qwen3.5 vocabulary (248k entries, :mod:`dressage.assets.tokenizers`);
- ours: the 689-entry Qwen3.5-format task vocabulary (:mod:`dressage.tiny.task_tokenizer`).

Measured per vocabulary: a training step (forward, next-token loss at the assistant's tokens,
logits only there as the trainers compute them, backward, AdamW), a scoring pass (the same
forward without gradient, what each teacher pays per sample), and the part of the
step spent in the output layer alone (the tied embedding's matmul and log-softmax over the
hidden states, forward and backward). Medians over ``--steps`` repetitions after one warm-up.
The last line is the JSON verdict: training-step time, target ours at least 5x faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def _median_s(fn: Any, steps: int) -> float:
    fn()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(vocab: str, steps: int, batch: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from dressage.causal_lm import causal_lm_hidden, output_embedding_module
    from dressage.tiny.model import TinyModelSpec, tiny_model_dir
    from dressage.tiny.teachers import teacher_transcripts

    path = tiny_model_dir(TinyModelSpec(vocab=vocab))  # type: ignore[arg-type]
    data = teacher_transcripts(("calculator", "lookup"), batch, seed=0, tokenizer_dir=path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    head = output_embedding_module(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = [torch.tensor(t.ids) for t in data]
    rows, cols, targets = [], [], []
    for i, t in enumerate(data):
        for p in range(1, len(t.ids)):
            if not t.loss_mask[p]:  # logits only where a token trains, as the trainers do
                continue
            rows.append(i)
            cols.append(p - 1)
            targets.append(t.ids[p])
    target = torch.tensor(targets)

    def train_step() -> None:
        hidden = causal_lm_hidden(model, tokens)
        logits = head(hidden[rows, cols]).float()
        loss = torch.nn.functional.cross_entropy(logits, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def score() -> None:
        with torch.no_grad():
            head(causal_lm_hidden(model, tokens)[rows, cols]).float().log_softmax(-1)

    with torch.no_grad():
        fixed = causal_lm_hidden(model, tokens)[rows, cols].detach()

    def output_layer() -> None:
        hidden = fixed.clone().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(head(hidden).float(), target)
        loss.backward()
        model.zero_grad(set_to_none=True)

    step = _median_s(train_step, steps)
    head_s = _median_s(output_layer, steps)
    return {
        "vocab": vocab,
        "vocab_size": int(head.weight.shape[0]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens": sum(len(t.ids) for t in data),
        "train_step_s": step,
        "score_s": _median_s(score, steps),
        "output_layer_s": head_s,
        "output_layer_share": min(head_s / step, 1.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from dressage.tiny.task_tokenizer import TASK_VOCAB

    base = measure("qwen3.5", args.steps, args.batch)
    ours = measure(TASK_VOCAB, args.steps, args.batch)
    for row in (base, ours):
        print(
            f"{row['vocab']:>14}: vocab {row['vocab_size']:>7}, {row['parameters']:>10,} params, "
            f"{row['tokens']} tokens; train step {row['train_step_s'] * 1e3:8.1f} ms "
            f"(output layer {row['output_layer_share']:.0%}), score {row['score_s'] * 1e3:7.1f} ms"
        )
    ratio = base["train_step_s"] / ours["train_step_s"]
    summary = {
        "metric": f"tiny-model training step, {args.batch} agent transcripts, CPU",
        "unit": "ms",
        "baseline": round(base["train_step_s"] * 1e3, 2),
        "ours": round(ours["train_step_s"] * 1e3, 2),
        "ratio": round(ratio, 2),
        "target": ">= 5x faster than the real Qwen3.5 vocabulary",
        "met": ratio >= 5.0,
        "threads": args.threads,
        "baseline_detail": base,
        "ours_detail": ours,
    }
    line = json.dumps(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
