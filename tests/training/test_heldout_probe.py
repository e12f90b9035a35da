"""The held-out probe's exact reverse KL, against a direct computation on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dressage.config.mopd import load_mopd_config
from dressage.training.embedded.probe import ALL, exact_reverse_kl, heldout_datasets
from dressage.types import Sample
from tests.helpers import REPO

pytestmark = pytest.mark.unit


def _sample(tokens: list[int], response: int, mask: list[int], teacher: str) -> Sample:
    sample = Sample(tokens=tokens, response_length=response, loss_mask=mask)
    sample.metadata = {"teacher_id": teacher}
    return sample


def test_exact_reverse_kl_is_the_token_mean_over_trainable_positions(
    tiny_model_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    from dressage.tiny import TinyModelSpec, tiny_model_dir

    student = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    other = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(TinyModelSpec(seed=1)))).eval()
    a = _sample([11, 12, 13, 14, 15, 16], 3, [1, 0, 1], "a")
    b = _sample([21, 22, 23, 24], 2, [1, 1], "b")
    got = exact_reverse_kl(student, {"a": other, "b": student}, [a, b])
    assert got["b"] == pytest.approx(0.0, abs=1e-6)  # a model against itself
    with torch.no_grad():
        ids = torch.tensor(a.tokens)[None]
        ls = torch.log_softmax(student(ids).logits[0].float(), -1)
        lt = torch.log_softmax(other(ids).logits[0].float(), -1)
        # response tokens 14, 15, 16 sit at 3..5 and are predicted at 2..4; 15 is masked out
        kls = [(ls[p].exp() * (ls[p] - lt[p])).sum().item() for p in (2, 4)]
    assert got["a"] == pytest.approx(sum(kls) / 2, rel=1e-5)
    assert got[ALL] == pytest.approx((sum(kls) + 0.0) / 4, rel=1e-5)  # pooled over 4 tokens


def test_held_out_rows_of_the_embedded_config(tmp_path: Path) -> None:
    config = load_mopd_config(REPO / "configs/mopd/embedded.json")
    entries = heldout_datasets(config)
    assert [(e["teacher_id"], e["weight"]) for e in entries] == [
        ("calculator", 16.0),
        ("lookup", 16.0),
    ]  # the teachers' own held-out instances (sft_report.json's agent_accuracy is on them)
    for entry, ds in zip(entries, config.datasets, strict=True):
        train = {json.loads(line)["input"] for line in Path(ds.path).read_text().splitlines()}
        held = [json.loads(line)["input"] for line in Path(entry["path"]).read_text().splitlines()]
        assert held and not set(held) & train, "held-out rows must never be trained on"
