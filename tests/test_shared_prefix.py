"""The shared-prefix forward gives the plain padded forward's hidden states and gradients on a
tiny Qwen3 model: real transcripts of two tasks, sequences of different lengths, a sequence
that is its group's prefix, sequences sharing nothing, identical sequences."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from dressage.causal_lm import causal_lm_hidden
from dressage.shared_prefix import PrefixGroup, prefix_groups, shared_prefix_hidden
from dressage.tiny import TinyModelSpec, tiny_model_dir
from dressage.tiny.teachers import teacher_transcripts

SPEC = TinyModelSpec(vocab="qwen3.5-tasks")


@pytest.fixture(scope="module")
def model() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(SPEC)), dtype=torch.float32)


@pytest.fixture(scope="module")
def mixed() -> list[Tensor]:
    """Calculator and lookup transcripts, interleaved (so groups are not contiguous)."""
    found = teacher_transcripts(
        ("calculator", "lookup"), 6, seed=3, tokenizer_dir=tiny_model_dir(SPEC)
    )
    return [torch.tensor(t.ids) for t in found]


def _common(tokens: list[Tensor]) -> int:
    n = min(int(t.numel()) for t in tokens)
    same = torch.stack([t[:n] for t in tokens]).eq(tokens[0][:n]).all(0)
    return int(same.long().cumprod(0).sum())


def _weighted_sum(hidden: Tensor, tokens: list[Tensor]) -> Tensor:
    """A loss over every real position (prefix ones included), with fixed random weights."""
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0))
    for i, t in enumerate(tokens):
        weights[i, t.numel() :] = 0.0  # padding carries no loss
    return (hidden * weights).sum()


def _hidden_and_grads(
    model: Any, tokens: list[Tensor], *, shared: bool
) -> tuple[Tensor, dict[str, Tensor]]:
    model.zero_grad(set_to_none=True)
    hidden = (shared_prefix_hidden if shared else causal_lm_hidden)(model, tokens)
    _weighted_sum(hidden, tokens).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), grads


def _assert_same(model: Any, tokens: list[Tensor]) -> None:
    """Real positions' hidden states to 1e-5; every parameter's gradient to float32 rounding
    (a sum over ~1,600 positions: 1e-6 of the tensor's largest entry)."""
    plain, plain_grads = _hidden_and_grads(model, tokens, shared=False)
    ours, our_grads = _hidden_and_grads(model, tokens, shared=True)
    assert ours.shape == plain.shape
    for i, t in enumerate(tokens):
        n = t.numel()
        torch.testing.assert_close(ours[i, :n], plain[i, :n], rtol=0, atol=1e-5)
    assert our_grads.keys() == plain_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        scale = float(grad.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6 * scale, msg=name)


@pytest.mark.unit
def test_groups_follow_the_tasks_not_their_shorter_common_start(mixed: list[Tensor]) -> None:
    calculator, lookup = mixed[0::2], mixed[1::2]
    across = _common([calculator[0], lookup[0]])
    assert 0 < across < 64 < _common(calculator)  # both tasks open with the same system prompt
    groups = prefix_groups(mixed)
    assert groups == [
        PrefixGroup((1, 3, 5), _common(lookup)),
        PrefixGroup((0, 2, 4), _common(calculator)),
    ] or groups == [
        PrefixGroup((0, 2, 4), _common(calculator)),
        PrefixGroup((1, 3, 5), _common(lookup)),
    ]
    # a low threshold still prefers two long prefixes to one short one
    assert {g.members for g in prefix_groups(mixed, min_prefix=across)} == {(0, 2, 4), (1, 3, 5)}
    single = prefix_groups([mixed[0], mixed[1]])
    assert single == [PrefixGroup((0, 1), 0)]  # nothing worth a pass: the plain forward
    with pytest.raises(ValueError, match="min_prefix must be at least 1, got 0"):
        prefix_groups(mixed, min_prefix=0)


@pytest.mark.unit
def test_synthetic_groups_maximise_the_skipped_positions() -> None:
    def seq(*parts: tuple[int, int]) -> Tensor:
        return torch.cat([torch.full((n,), v) for v, n in parts])

    a = [seq((1, 10), (2, 50), (i + 5, 3)) for i in range(3)]
    b = [seq((1, 10), (3, 50), (i + 5, 3 + i)) for i in range(3)]
    loner = seq((4, 80))
    batch = [b[0], a[0], loner, a[1], b[1], a[2], b[2]]
    assert prefix_groups(batch, min_prefix=5) == [
        PrefixGroup((1, 3, 5), 60),
        PrefixGroup((0, 4, 6), 60),
        PrefixGroup((2,), 0),
    ]
    # below min_prefix a common start is not a group
    assert prefix_groups(batch, min_prefix=61) == [PrefixGroup(tuple(range(7)), 0)]


@pytest.mark.unit
def test_mixed_tasks_match_the_plain_forward(model: Any, mixed: list[Tensor]) -> None:
    """Two groups, members of different lengths, rows restored to the batch's order."""
    assert len({t.numel() for t in mixed}) > 1
    _assert_same(model, mixed)


@pytest.mark.unit
def test_edge_cases_match_the_plain_forward(model: Any, mixed: list[Tensor]) -> None:
    """A member that is exactly its group's prefix (empty suffix), a sequence sharing nothing
    (the plain group beside a prefix group), and a group of identical sequences (no suffix)."""
    calculator = mixed[0::2]
    prefix = calculator[0][: _common(calculator)]
    unrelated = mixed[1][-20:]
    batch = [calculator[0], prefix, unrelated, calculator[1]]
    assert prefix_groups(batch) == [PrefixGroup((0, 1, 3), prefix.numel()), PrefixGroup((2,), 0)]
    _assert_same(model, batch)
    twins = [mixed[1], mixed[1].clone()]
    assert prefix_groups(twins) == [PrefixGroup((0, 1), mixed[1].numel())]
    _assert_same(model, twins)


@pytest.mark.unit
def test_without_a_shared_prefix_it_is_the_plain_forward(model: Any, mixed: list[Tensor]) -> None:
    batch = [mixed[0], mixed[1], mixed[2][-30:]]
    with torch.no_grad():
        assert torch.equal(shared_prefix_hidden(model, batch), causal_lm_hidden(model, batch))
    with pytest.raises(ValueError, match=r"non-empty sequences, got lengths \[.*, 0\]"):
        shared_prefix_hidden(model, [mixed[0], torch.tensor([], dtype=torch.long)])


@pytest.mark.unit
def test_the_trainers_log_probs_and_packed_logits_compute_each_prefix_once(
    model: Any, mixed: list[Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring (response log-probs, the dense objective's log-softmax) and the loss hook's packed
    logits run each task's prompt once, and give the plain forward's values."""
    import dressage.shared_prefix as sp
    from dressage.causal_lm import output_embedding_module
    from dressage.training.log_probs import (
        causal_lm_packed_logits,
        causal_lm_response_log_probs,
        causal_lm_response_log_softmax,
    )

    passes: list[int] = []
    group_hidden = sp._group_hidden

    def counted(model: Any, tokens: Any, prefix_length: int) -> Tensor:
        passes.append(len(tokens))
        return group_hidden(model, tokens, prefix_length)

    monkeypatch.setattr(sp, "_group_hidden", counted)
    resp = [12] * len(mixed)
    with torch.no_grad():
        plain = causal_lm_hidden(model, mixed)
        head = output_embedding_module(model)
        want = [
            torch.log_softmax(head(plain[i, t.numel() - r - 1 : t.numel() - 1]), -1)
            for i, (t, r) in enumerate(zip(mixed, resp, strict=True))
        ]
        got = causal_lm_response_log_probs(model, mixed, resp)
        assert sorted(passes) == [3, 3]  # one pass per task's prompt, three members each
        dense = causal_lm_response_log_softmax(model, mixed, resp)
        packed = causal_lm_packed_logits(model, mixed)
    assert len(passes) == 6
    for i, t in enumerate(mixed):
        target = t[t.numel() - resp[i] :]
        torch.testing.assert_close(got[i], want[i].gather(-1, target[:, None]).squeeze(-1),
                                   rtol=0, atol=1e-5)  # fmt: skip
        torch.testing.assert_close(dense[i], want[i], rtol=0, atol=1e-5)
    flat = torch.cat([plain[i, : t.numel()] for i, t in enumerate(mixed)])
    torch.testing.assert_close(packed[0], head(flat).detach(), rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_it_matches_the_plain_forward(model: Any, mixed: list[Tensor]) -> None:
    """The prefix group's position ids are an expanded view (rows sharing memory); the pinned
    host-to-device copy refused it until it made the view contiguous (first seen on the H200)."""
    from dressage.causal_lm import to_device

    expanded = torch.arange(5).expand(3, 5)
    assert torch.equal(to_device(expanded, torch.device("cuda")).cpu(), expanded)
    gpu = model.to("cuda")
    try:
        with torch.no_grad():
            ours = shared_prefix_hidden(gpu, mixed)
            plain = causal_lm_hidden(gpu, mixed)
        for i, t in enumerate(mixed):
            n = t.numel()
            torch.testing.assert_close(ours[i, :n], plain[i, :n], rtol=0, atol=1e-4)
    finally:
        model.to("cpu")
