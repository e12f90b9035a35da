"""A held-out probe of MOPD progress: the exact reverse KL to each teacher on fixed contexts.

    probe = HeldOutProbe.collect(args, config)        # once, with the initial student serving
    probe.measure(trainer.model)                      # {"calculator": 1.71, ..., "all": 1.80}

The sampled-token reverse KL that MOPD logs every step is measured on the student's own fresh
samples: it moves with the contexts the student visits as much as with the student itself, and
a handful of samples per teacher makes it noisy. The probe holds the contexts still. Once, before
training, the initial student works every row of the datasets' ``eval_path`` files (held-out
rows, never trained on) through the same agent and proxy; after that, :meth:`measure` computes
``KL(student || teacher)`` over the whole vocabulary at every trainable token of those samples:
the expectation of the sampled-token estimate there, free of sampling noise. Per teacher and
pooled over all tokens (``all``).

The teachers are loaded as separate CPU/GPU models: meant for the embedded default's small
models (a cluster run would score on the trainer's shared buffers).
"""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dressage.config.mopd import MopdConfig
from dressage.types import Sample

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ALL", "HeldOutProbe", "exact_reverse_kl", "heldout_datasets"]

ALL = "all"
"""The key of the value pooled over every teacher's tokens."""


def heldout_datasets(config: MopdConfig) -> list[dict[str, Any]]:
    """The config's ``eval_path`` files as dataset entries, weighted by their row counts."""
    out = []
    for ds in config.datasets:
        if not ds.eval_path:
            continue
        rows = sum(1 for line in Path(ds.eval_path).read_text().splitlines() if line.strip())
        if rows:
            out.append(
                {
                    "name": f"{ds.name}-eval",
                    "path": ds.eval_path,
                    "teacher_id": ds.teacher_id,
                    "weight": float(rows),
                    "agent_mode": ds.agent_mode,
                    "generate_function_path": ds.generate_function_path,
                    "task": ds.task,
                    "input_key": ds.input_key,
                    "label_key": ds.label_key,
                    "metadata_key": ds.metadata_key,
                }
            )
    return out


def exact_reverse_kl(
    student: nn.Module, teachers: Mapping[str, nn.Module], samples: list[Sample]
) -> dict[str, float]:
    """Token mean of ``KL(student || teacher)`` over the vocabulary at trainable positions."""
    import torch

    total: dict[str, float] = {}
    count: dict[str, int] = {}
    device = next(student.parameters()).device
    with torch.no_grad():
        for sample in samples:
            tid = sample.metadata["teacher_id"]
            mask = torch.tensor(sample.loss_mask or [], dtype=torch.bool, device=device)
            if not mask.any():
                continue
            ids = torch.tensor(sample.tokens, device=device)[None]
            start = len(sample.tokens) - sample.response_length
            window = slice(start - 1, len(sample.tokens) - 1)
            logp_s = torch.log_softmax(student(ids).logits[0, window].float(), -1)[mask]
            logp_t = torch.log_softmax(teachers[tid](ids).logits[0, window].float(), -1)[mask]
            kl = (logp_s.exp() * (logp_s - logp_t)).sum(-1)
            total[tid] = total.get(tid, 0.0) + float(kl.sum())
            count[tid] = count.get(tid, 0) + int(mask.sum())
    means = {tid: total[tid] / count[tid] for tid in sorted(total)}
    if count:
        means[ALL] = sum(total.values()) / sum(count.values())
    return means


@dataclass
class HeldOutProbe:
    samples: list[Sample]
    teachers: dict[str, nn.Module] = field(repr=False)
    history: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def collect(cls, args: Namespace, config: MopdConfig) -> HeldOutProbe | None:
        """Run the held-out rows once through the rollout; None when no dataset has any."""
        from transformers import AutoModelForCausalLM

        from dressage.rollout.data_source import MopdDataSource
        from dressage.training.embedded.rollout import EmbeddedRolloutManager

        datasets = heldout_datasets(config)
        if not datasets:
            return None
        probe_args = Namespace(**vars(args))
        probe_args.dressage_datasets = json.loads(json.dumps(datasets))
        probe_args.rollout_batch_size = int(sum(d["weight"] for d in datasets))
        probe_args.rollout_shuffle = False
        probe_args.rollout_function_path = None  # one synchronous batch
        manager = EmbeddedRolloutManager(probe_args, MopdDataSource(probe_args))
        _, samples, _ = manager.generate(0)
        teachers: dict[str, nn.Module] = {}
        for tid in sorted({d["teacher_id"] for d in datasets}):
            model = AutoModelForCausalLM.from_pretrained(str(config.teachers[tid].load))
            teachers[tid] = model.eval()  # moved to the student's device by measure()
        return cls(samples=samples, teachers=teachers)

    def measure(self, student: nn.Module) -> dict[str, float]:
        """The exact reverse KL per teacher and pooled; also appended to :attr:`history`."""
        was_training = student.training
        student.eval()
        try:
            device = next(student.parameters()).device
            for model in self.teachers.values():
                model.to(device)
            values = exact_reverse_kl(student, self.teachers, self.samples)
        finally:
            student.train(was_training)
        self.history.append(values)
        return values
