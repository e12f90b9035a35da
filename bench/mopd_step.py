"""Benchmark: one whole MOPD step with 2 teachers, against reloading teachers from disk.

    .venv/bin/python bench/mopd_step.py                           # CPU, small shapes (~1 min)
    python bench/mopd_step.py --device cuda --out bench/results/mopd_step_cuda.json

A step is ``EmbeddedTrainer.train(rollout_id, train_data)`` with the MOPD hooks: student and
teacher log-probs, ``compute_mopd_advantages``, ``mopd_policy_loss``, backward, AdamW. Student and
teachers are random Qwen3 models of one shape (on CUDA Qwen3-1.7B-shaped, bf16), saved as
Hugging Face safetensors folders first.

* ours: the trainer's TeacherBank (every teacher in pinned host memory, streamed into the
  student's buffers behind compute on CUDA).
* baseline: the same trainer, but each teacher is read from its safetensors folder whenever it
  is needed (``safetensors.torch.load_file`` into the shared buffers; the page cache is warm after
  the first step, which favours the baseline).

Both start from the same weights and data; their first-step losses are printed side by side.
The last line printed is the JSON summary; ratio = ours / baseline (lower is better).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from teacher_rotation import SHAPES, build_model, randomize, sync  # noqa: E402

from dressage.training.embedded import EmbeddedTrainer, trainer_args  # noqa: E402
from dressage.training.teacher_rotation import TeacherBank  # noqa: E402

MOPD = {
    "custom_advantage_function_path": "dressage.training.mopd_loss.compute_mopd_advantages",
    "loss_type": "custom_loss",
    "custom_loss_function_path": "dressage.training.mopd_loss.mopd_policy_loss",
    "advantage_estimator": "mopd",
}


class DiskReloadBank(TeacherBank):
    """The baseline: teachers are not kept in memory but read from safetensors at every swap."""

    def __init__(self, model: nn.Module, sources: dict[str, Path]) -> None:
        super().__init__(model)
        self.sources = sources
        for tag in sources:
            self.backups[tag] = {}  # known tag, no host copy

    def restore(self, tag: str) -> None:
        if tag not in self.sources:
            super().restore(tag)
            return
        from safetensors.torch import load_file

        with torch.no_grad():
            for file in sorted(self.sources[tag].glob("*.safetensors")):
                for name, tensor in load_file(str(file)).items():
                    if name in self.params:
                        self.params[name].copy_(tensor)

    def score(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        kwargs["overlap"] = False  # streaming reads the host copies this bank does not keep
        return super().score(*args, **kwargs)


def save_models(
    shape: str, dtype: torch.dtype, root: Path, device: torch.device
) -> dict[str, Path]:
    """Student and two teachers (different random weights) as Hugging Face folders."""
    model = build_model(shape, device, dtype)
    out = {}
    for seed, name in enumerate(("student", "math", "code")):
        randomize(model, seed=seed)
        out[name] = root / name
        model.save_pretrained(str(out[name]))
    return out


def make_train_data(rollouts: int, prompt: int, response: int, vocab: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    n = rollouts
    return {
        "tokens": [
            torch.randint(0, vocab, (prompt + response,), generator=gen).tolist() for _ in range(n)
        ],
        "response_lengths": [response] * n,
        "loss_masks": [[1] * response for _ in range(n)],
        "rollout_ids": list(range(n)),
        "rollout_mask_sums": [float(response)] * n,
        "rewards": [0.0] * n,
        "raw_reward": [float(i % 2) for i in range(n)],
        "prompt": ["math" if i % 2 == 0 else "code" for i in range(n)],
    }


def build(args: Any, paths: dict[str, Path], dtype: torch.dtype, baseline: bool) -> EmbeddedTrainer:
    trainer = EmbeddedTrainer(
        args,
        model_path=paths["student"],
        teachers={"math": paths["math"], "code": paths["code"]},
        dtype=dtype,
    )
    if baseline:
        assert trainer.bank is not None
        trainer.bank.close()  # drop the host copies the baseline must not use
        trainer.bank = DiskReloadBank(
            trainer.model, {f"teacher:{t}": paths[t] for t in ("math", "code")}
        )
    return trainer


def compare(
    trainers: dict[str, EmbeddedTrainer], data: dict[str, Any], steps: int
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Best step time per trainer; trainers take turns each round so load drift hits both."""
    first = {name: t.train(0, data) for name, t in trainers.items()}  # warm-up, same first step
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for k in range(steps):
        for name, trainer in trainers.items():
            sync(trainer.device)
            start = time.perf_counter()
            trainer.train(k + 1, data)
            sync(trainer.device)
            times[name].append(time.perf_counter() - start)
    for name in trainers:
        m = first[name]
        print(
            f"{name}: step {min(times[name]):.3f} s (best of {steps}; all "
            f"{[round(t, 3) for t in times[name]]}), first-step mopd_loss "
            f"{m['train/mopd_loss']:.6f}, log-probs {m['perf/log_probs_time']:.3f} s, "
            f"train {m['perf/train_time']:.3f} s"
        )
    if torch.cuda.is_available():
        print(f"peak GPU memory (both trainers): {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")
    return {name: min(t) for name, t in times.items()}, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES))
    parser.add_argument("--rollouts", type=int, default=None, help="rollouts (= samples) per step")
    parser.add_argument("--prompt", type=int, default=None)
    parser.add_argument("--response", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    shape = args.shape or ("qwen3-1.7b" if cuda else "small")
    dtype = torch.bfloat16 if cuda else torch.float32
    rollouts = args.rollouts or (32 if cuda else 8)
    prompt = args.prompt or (512 if cuda else 32)
    response = args.response or (512 if cuda else 32)
    train_args = trainer_args(
        device=args.device,
        global_batch_size=rollouts,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=8192 if cuda else 512,
        log_probs_max_tokens=16384 if cuda else 1024,
        lr=1e-6,
        bf16=cuda,
        **MOPD,
    )
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        paths = save_models(shape, dtype, Path(tmp), torch.device(args.device))
        size = sum(f.stat().st_size for f in paths["math"].glob("*.safetensors")) / 1e9
        print(
            f"{shape} ({dtype}), {size:.2f} GB per checkpoint, saved in "
            f"{time.perf_counter() - start:.1f} s; step: {rollouts} rollouts x "
            f"({prompt} prompt + {response} response) tokens, 2 teachers, on {args.device}"
        )
        data = make_train_data(rollouts, prompt, response, SHAPES[shape]["vocab_size"])
        trainers = {
            "ours (pinned host bank)": build(train_args, paths, dtype, baseline=False),
            "baseline (reload from disk)": build(train_args, paths, dtype, baseline=True),
        }
        best, first = compare(trainers, data, args.steps)
        for trainer in trainers.values():
            if trainer.bank is not None:
                trainer.bank.close()
    (ours, first_ours), (base, first_base) = ((best[k], first[k]) for k in trainers)
    loss_gap = abs(first_ours["train/mopd_loss"] - first_base["train/mopd_loss"])
    ratio = ours / base
    print(
        f"ours / baseline = {ratio:.3f} ({base / ours:.2f}x faster); "
        f"|first-step loss gap| {loss_gap:.2e}"
    )
    summary = {
        "metric": "whole MOPD step with 2 teachers (embedded trainer)",
        "unit": "s",
        "baseline": round(base, 4),
        "ours": round(ours, 4),
        "ratio": round(ratio, 4),
        "target": "< 1.0 (faster than reloading each teacher from safetensors)",
        "met": ratio < 1.0,
        "device": args.device,
        "shape": shape,
        "checkpoint_gb": round(size, 3),
        "tokens_per_step": rollouts * (prompt + response),
        "first_step_loss_gap": loss_gap,
    }
    line = json.dumps(summary)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
