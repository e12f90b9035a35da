"""The lm_head + sampler against plain full-vocabulary math on a synthetic head."""

from __future__ import annotations

import math
import random
import threading

import pytest
import torch

from dressage.engine.request import Request
from dressage.engine.sampling import RowSpec, SamplingParams, StepInterrupted, VocabSampler

pytestmark = pytest.mark.unit

VOCAB, HIDDEN = 5003, 16  # odd vocabulary: exercises the padded last chunk and block


def _head(seed: int = 0, bias: bool = False) -> torch.nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen) * 0.8)
        if bias:
            head.bias.copy_(torch.randn(VOCAB, generator=gen))
    return head.requires_grad_(False)


def _hidden(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("chunk_elements", "workers"), [(None, 1), (1 << 10, 1), (1 << 14, 1), (1 << 10, 3)]
)
@pytest.mark.parametrize("batch", [1, 5, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_logprobs_are_log_softmax_at_temperature(chunk_elements, workers, batch, bias) -> None:
    head, hidden = _head(bias=bias), _hidden(batch)
    sampler = VocabSampler(head, chunk_elements=chunk_elements, workers=workers)
    rng = random.Random(0)
    temps = [rng.choice([0.0, 0.5, 1.0, 1.7]) for _ in range(batch)]
    rows = [RowSpec(1.0 if t == 0 else 1.0 / t, t == 0, rng.random()) for t in temps]
    with torch.no_grad():
        tokens, logprobs = sampler.sample(hidden, rows)
        logits = head(hidden)
    for i, (tok, lp, t) in enumerate(zip(tokens, logprobs, temps, strict=True)):
        expected = torch.log_softmax(logits[i] / (t or 1.0), dim=-1)[tok]
        assert lp == pytest.approx(float(expected), abs=1e-5)
        if t == 0:
            assert tok == int(logits[i].argmax())


def test_inverse_cdf_follows_the_distribution() -> None:
    """Empirical token frequencies match softmax probabilities (chunked path, many draws)."""
    head = _head(seed=3)
    hidden = _hidden(1, seed=4) * 3  # a peaked distribution: a few tokens carry most mass
    sampler = VocabSampler(head, chunk_elements=1 << 10)
    probs = torch.softmax(head(hidden)[0].detach(), dim=-1)
    top = torch.topk(probs, 5).indices.tolist()
    rng = random.Random(7)
    draws = 4000
    counts = dict.fromkeys(top, 0)
    with torch.no_grad():
        batch = hidden.repeat(draws, 1)
        tokens, _ = sampler.sample(batch, [RowSpec(1.0, False, rng.random()) for _ in range(draws)])
    for tok in tokens:
        if tok in counts:
            counts[tok] += 1
    for tok in top:
        p = float(probs[tok])
        sd = math.sqrt(p * (1 - p) / draws)
        assert abs(counts[tok] / draws - p) < 5 * sd + 1e-3, (tok, counts[tok] / draws, p)


def test_uniform_maps_monotonically_to_tokens_in_cdf_order() -> None:
    """u -> token is the inverse CDF: u=0 gives the first token with mass, u->1 the last."""
    head = _head(seed=5)
    sampler = VocabSampler(head, chunk_elements=1 << 12)
    hidden = _hidden(1, seed=6)
    us = [0.0, 0.1, 0.37, 0.5, 0.81, 0.999999]
    with torch.no_grad():
        tokens, _ = sampler.sample(hidden.repeat(len(us), 1), [RowSpec(1.0, False, u) for u in us])
        cdf = torch.softmax(head(hidden)[0], -1).cumsum(0)
    expected = [int(torch.searchsorted(cdf, torch.tensor([u]), right=True)[0]) for u in us]
    assert tokens == [min(e, VOCAB - 1) for e in expected]


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"), [(7, 1.0, 0.0), (-1, 0.3, 0.0), (-1, 1.0, 0.2), (50, 0.5, 0.05)]
)
def test_filters_only_sample_allowed_tokens(top_k, top_p, min_p) -> None:
    head, hidden = _head(seed=8), _hidden(1, seed=9) * 2
    sampler = VocabSampler(head, chunk_elements=1 << 12)
    with torch.no_grad():
        probs = torch.softmax(head(hidden)[0] / 0.8, -1)
    order = torch.argsort(probs, descending=True)
    sorted_p = probs[order]
    keep = torch.ones(VOCAB, dtype=torch.bool)
    if top_k > 0:
        keep &= torch.arange(VOCAB) < top_k
    keep &= (sorted_p.cumsum(0) - sorted_p) <= top_p
    keep &= sorted_p >= min_p * sorted_p[0]
    allowed = set(order[keep].tolist())
    rng = random.Random(1)
    rows = [RowSpec(1 / 0.8, False, rng.random(), top_k, top_p, min_p) for _ in range(300)]
    with torch.no_grad():
        tokens, logprobs = sampler.sample(hidden.repeat(len(rows), 1), rows)
    assert set(tokens) <= allowed
    assert len(set(tokens)) > 1 or len(allowed) == 1
    for tok, lp in zip(tokens, logprobs, strict=True):  # logprobs are pre-truncation
        assert lp == pytest.approx(math.log(float(probs[tok])), abs=1e-5)


@pytest.mark.parametrize("workers", [1, 2])
def test_same_uniforms_same_tokens_regardless_of_batch(workers: int) -> None:
    head = _head(seed=10)
    sampler = VocabSampler(head, chunk_elements=1 << 12, workers=workers)
    hidden = _hidden(6, seed=11)
    rows = [RowSpec(1.0, False, u) for u in (0.11, 0.52, 0.93, 0.27, 0.64, 0.05)]
    with torch.no_grad():
        together, _ = sampler.sample(hidden, rows)
        alone = [sampler.sample(hidden[i : i + 1], [rows[i]])[0][0] for i in range(6)]
    assert together == alone


def test_prompt_logprobs_match_log_softmax() -> None:
    head, hidden = _head(seed=12, bias=True), _hidden(70, seed=13)
    sampler = VocabSampler(head, chunk_elements=None)
    targets = [random.Random(i).randrange(VOCAB) for i in range(70)]
    with torch.no_grad():
        got = sampler.prompt_logprobs(hidden, targets)
        ref = torch.log_softmax(head(hidden), -1)
    assert got == pytest.approx([float(ref[i, t]) for i, t in enumerate(targets)], abs=1e-5)


def test_an_interrupted_pass_chooses_nothing() -> None:
    sampler = VocabSampler(_head(), chunk_elements=1 << 10, workers=2)
    stop = threading.Event()
    stop.set()
    with torch.no_grad(), pytest.raises(StepInterrupted):
        sampler.sample(_hidden(3), [RowSpec(1.0, False, 0.5)] * 3, stop)
    stop.clear()
    with torch.no_grad():
        tokens, _ = sampler.sample(_hidden(3), [RowSpec(1.0, False, 0.5)] * 3, stop)
    assert len(tokens) == 3


def test_uniforms_are_a_function_of_seed_and_position() -> None:
    def req(seed: int | None) -> Request:
        return Request(
            rid="r", prompt_ids=[1], params=SamplingParams(sampling_seed=seed), max_new_tokens=9
        )

    a, b, c = req(5), req(5), req(6)
    assert a.next_uniform() == b.next_uniform() != c.next_uniform()
    first = a.next_uniform()
    a.append(3, 0.0, "v")
    assert a.next_uniform() != first  # the next position draws a new number
    draws = []
    for _ in range(4000):
        r = req(None)
        draws.append(r.next_uniform())
    assert all(0.0 <= u < 1.0 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.03
    assert abs(sum(u < 0.1 for u in draws) / len(draws) - 0.1) < 0.03


@pytest.mark.parametrize("chunk_elements", [None, 1 << 10])
def test_a_certain_token_has_logprob_zero_never_above(chunk_elements) -> None:
    """A model all but sure of its token: the chunked base-2 pass must not round its logprob
    above 0 (the proxy refuses such a step, and a trained tiny teacher is this sure)."""
    head = _head()
    with torch.no_grad():
        head.weight[7] *= 40.0  # token 7's logit dwarfs every other one
    hidden = head.weight[7:8].clone() / head.weight[7].norm()
    sampler = VocabSampler(head, chunk_elements=chunk_elements)
    scales = [1.0, 1.3, 2.1, 3.7, 5.3, 8.9, 13.1]
    with torch.no_grad():
        for scale in scales:
            tokens, logprobs = sampler.sample(hidden * scale, [RowSpec(1.0, True, 0.0)])
            assert tokens == [7]
            assert logprobs[0] <= 0.0, (scale, logprobs[0])
            assert sampler.prompt_logprobs(hidden * scale, [7])[0] <= 0.0
