"""The teachers' fine-tuning loss through the shared-prefix forward: the same per-token
log-probs and the same parameter gradients as the plain padded forward, in float32."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dressage.shared_prefix import prefix_groups
from dressage.tiny import TinyModelSpec, tiny_model_dir
from dressage.tiny.teachers import Transcript, _masked_log_probs, teacher_transcripts

SPEC = TinyModelSpec(vocab="qwen3.5-tasks")


@pytest.fixture(scope="module")
def model() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(SPEC)), dtype=torch.float32)


@pytest.fixture(scope="module")
def batch() -> list[Transcript]:
    return teacher_transcripts("calculator", 6, seed=1, tokenizer_dir=tiny_model_dir(SPEC))


@pytest.mark.unit
def test_the_batch_shares_a_prefix_before_every_trained_token(batch: list[Transcript]) -> None:
    """What the speed-up rests on (and what the tests below exercise): one group, its prefix
    ending before the first assistant token."""
    (group,) = prefix_groups([torch.tensor(t.ids) for t in batch])
    assert group.members == tuple(range(len(batch)))
    assert 100 < group.prefix_length < min(t.loss_mask.index(1) for t in batch)


@pytest.mark.unit
def test_masked_log_probs_match_the_plain_forward(model: Any, batch: list[Transcript]) -> None:
    with torch.no_grad():
        ours = _masked_log_probs(model, batch)
        plain = _masked_log_probs(model, batch, shared_prefix=False)
    assert ours.shape == plain.shape == (sum(sum(t.loss_mask) for t in batch),)
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-5)


@pytest.mark.unit
def test_nll_gradients_match_the_plain_forward(model: Any, batch: list[Transcript]) -> None:
    """Every parameter's gradient of the mean NLL, the prefix's share (through the cached keys
    and values the suffixes attend to) included."""
    grads = []
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        (-_masked_log_probs(model, batch, shared_prefix=shared).mean()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    ours, plain = grads
    assert ours.keys() == plain.keys() and len(plain) == len(list(model.parameters()))
    for name, grad in plain.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-7, msg=name)
