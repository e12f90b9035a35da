"""Teacher rotation on tiny Qwen3 models: scores, order, student restored bit for bit, streaming."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from dressage.training.log_probs import (
    causal_lm_response_log_probs,
    causal_lm_response_log_softmax,
)
from dressage.training.mopd_topk import TeacherSupport, support_of
from dressage.training.teacher_rotation import TeacherBank, plan_micro_batches
from dressage.training.weight_streaming import InlineCopies, LayerStreamer, find_layer_list
from tests.training.train_data_factory import load_tiny, tiny_dir

pytestmark = pytest.mark.unit

LENGTHS = [(6, 4), (9, 5), (4, 3), (7, 4), (12, 6), (5, 2), (8, 4)]
TAGS = ["code", "math", "student", "math", "code", "math", "student"]


@pytest.fixture(scope="module")
def student() -> nn.Module:
    return load_tiny(0)


@pytest.fixture(scope="module")
def bank(student: nn.Module) -> Iterator[TeacherBank]:
    bank = TeacherBank(student)
    bank.add_teacher("math", tiny_dir(1))
    bank.add_teacher("code", tiny_dir(2))
    yield bank
    bank.close()


@pytest.fixture(scope="module")
def batch() -> tuple[list[torch.Tensor], list[int]]:
    gen = torch.Generator().manual_seed(3)
    tokens = [torch.randint(0, 200_000, (p + r,), generator=gen) for p, r in LENGTHS]
    return tokens, [r for _, r in LENGTHS]


@pytest.fixture(scope="module")
def alone(student: nn.Module, batch: tuple[list[torch.Tensor], list[int]]) -> list[torch.Tensor]:
    """Each sample scored by the model its tag names, on its own (no bank, no rotation)."""
    tokens, resp = batch
    models = {"student": student, "math": load_tiny(1), "code": load_tiny(2)}
    with torch.no_grad():
        return [
            causal_lm_response_log_probs(models[tag], [t], [r])[0]
            for t, r, tag in zip(tokens, resp, TAGS, strict=True)
        ]


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "streamed"])
def test_scores_equal_each_model_alone_and_the_student_comes_back_bit_for_bit(
    student: nn.Module,
    bank: TeacherBank,
    batch: tuple[list[torch.Tensor], list[int]],
    alone: list[torch.Tensor],
    overlap: bool,
) -> None:
    tokens, resp = batch
    before = _snapshot(student)
    # a budget of 20 padded tokens forces several micro-batches per teacher
    scores = bank.score(tokens, resp, TAGS, max_tokens=20, overlap=overlap)
    assert [s.numel() for s in scores] == resp  # input order kept
    for i, tag in enumerate(TAGS):
        assert torch.allclose(scores[i], alone[i], atol=1e-5), (i, tag)
    after = _snapshot(student)
    assert all(torch.equal(before[n], after[n]) for n in before)


PREFIX_TAGS = ["student", "student", "math", "math", "code", "code"]


@pytest.fixture(scope="module")
def prefixed() -> tuple[list[torch.Tensor], list[int]]:
    """Agent-like samples: one 80-token prompt prefix (over the shared-prefix forward's
    minimum), then each sample's own turn."""
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 200_000, (80,), generator=gen)
    tokens = [torch.cat([prefix, torch.randint(0, 200_000, (n,), generator=gen)]) for n in
              (6, 9, 5, 8, 7, 6)]  # fmt: skip
    return tokens, [4, 5, 3, 4, 4, 3]


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "streamed"])
def test_samples_sharing_a_prompt_prefix_score_as_each_model_alone(
    student: nn.Module,
    bank: TeacherBank,
    prefixed: tuple[list[torch.Tensor], list[int]],
    overlap: bool,
) -> None:
    """The shared-prefix forward runs the layers twice (the prefix, then the suffixes on its
    cache): a model streamed in behind the current one's last micro-batch must land after the
    second pass, not between the two (it did: the student scored with the next teacher's
    layers on its last micro-batch)."""
    tokens, resp = prefixed
    models = {"student": student, "math": load_tiny(1), "code": load_tiny(2)}
    with torch.no_grad():
        alone = [
            causal_lm_response_log_probs(models[tag], [t], [r])[0]
            for t, r, tag in zip(tokens, resp, PREFIX_TAGS, strict=True)
        ]
    # two samples per micro-batch: every model's pass is one shared-prefix group
    scores = bank.score(tokens, resp, PREFIX_TAGS, max_tokens=200, overlap=overlap)
    for i, tag in enumerate(PREFIX_TAGS):
        assert torch.allclose(scores[i], alone[i], atol=1e-5), (i, tag)


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "streamed"])
def test_full_tags_get_the_whole_log_softmax_at_their_response_positions(
    student: nn.Module,
    bank: TeacherBank,
    batch: tuple[list[torch.Tensor], list[int]],
    alone: list[torch.Tensor],
    overlap: bool,
) -> None:
    tokens, resp = batch
    vocab = student.get_output_embeddings().weight.shape[0]
    before = _snapshot(student)
    scores = bank.score(tokens, resp, TAGS, max_tokens=20, overlap=overlap, full_tags={"math"})
    for i, tag in enumerate(TAGS):
        if tag != "math":  # the others keep their sampled-token log-probs
            assert torch.allclose(scores[i], alone[i], atol=1e-5), (i, tag)
            continue
        assert scores[i].shape == (resp[i], vocab) and scores[i].dtype == torch.float32
        assert torch.allclose(scores[i].exp().sum(-1), torch.ones(resp[i]), atol=1e-4)
        picked = scores[i].gather(-1, tokens[i][-resp[i] :, None]).squeeze(-1)
        assert torch.allclose(picked, alone[i], atol=1e-5), i
    after = _snapshot(student)
    assert all(torch.equal(before[n], after[n]) for n in before)


def _supports(scores: list[torch.Tensor]) -> list[TeacherSupport | None]:
    return [support_of(s) for s in scores]


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "streamed"])
def test_topk_tags_carry_each_models_top_k_on_its_sampled_token_log_probs(
    student: nn.Module,
    bank: TeacherBank,
    batch: tuple[list[torch.Tensor], list[int]],
    alone: list[torch.Tensor],
    overlap: bool,
) -> None:
    tokens, resp = batch
    models = {"student": student, "math": load_tiny(1), "code": load_tiny(2)}
    before = _snapshot(student)
    scores = bank.score(
        tokens, resp, TAGS, max_tokens=20, overlap=overlap, topk_tags={"math", "code"}, topk=4
    )
    for i, tag in enumerate(TAGS):
        assert scores[i].shape == (resp[i],)
        assert torch.allclose(scores[i], alone[i], atol=1e-5), (i, tag)
        support = support_of(scores[i])
        if tag == "student":  # the student's own pass keeps no support
            assert support is None, i
            continue
        assert support is not None and support.ids.shape == (resp[i], 4), i
        with torch.no_grad():
            dist = causal_lm_response_log_softmax(models[tag], [tokens[i]], [resp[i]])[0]
        top = dist.topk(4, dim=-1)
        assert torch.equal(support.ids.long(), top.indices), (i, tag)
        assert torch.allclose(support.log_probs, top.values, atol=1e-5), (i, tag)
        kept = torch.zeros_like(dist, dtype=torch.bool).scatter_(-1, top.indices, True)
        kept.scatter_(-1, tokens[i][-resp[i] :, None], True)
        tail = dist.masked_fill(kept, float("-inf")).logsumexp(-1)
        assert torch.allclose(support.tail, tail, atol=1e-4), (i, tag)
    after = _snapshot(student)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_sequential_and_streamed_scoring_give_the_same_top_k_supports(
    bank: TeacherBank, batch: tuple[list[torch.Tensor], list[int]]
) -> None:
    tokens, resp = batch
    runs = [
        bank.score(tokens, resp, TAGS, max_tokens=20, overlap=overlap, topk_tags={"math"}, topk=3)
        for overlap in (False, True)
    ]
    sequential, streamed = (_supports(run) for run in runs)
    assert [s is not None for s in sequential] == [tag == "math" for tag in TAGS]
    for i, (a, b) in enumerate(zip(sequential, streamed, strict=True)):
        assert torch.allclose(runs[0][i], runs[1][i], atol=1e-6), i
        if a is None or b is None:
            assert a is None and b is None, i
            continue
        assert torch.equal(a.ids, b.ids), i
        assert torch.allclose(a.log_probs, b.log_probs, atol=1e-6), i
        assert torch.allclose(a.tail, b.tail, atol=1e-6), i


def test_topk_scoring_refuses_what_it_cannot_do(
    student: nn.Module, bank: TeacherBank, batch: tuple[list[torch.Tensor], list[int]]
) -> None:
    tokens, resp = batch
    vocab = student.get_output_embeddings().weight.shape[0]
    for options, message in (
        ({"topk_tags": {"math"}}, r"topk_tags \['math'\] need topk >= 1, got 0"),
        ({"topk_tags": {"math"}, "full_tags": {"math"}, "topk": 2}, r"in both full_tags and"),
        ({"topk_tags": {"math"}, "topk": vocab + 1}, rf"--mopd-topk {vocab + 1} must be between"),
    ):
        with pytest.raises(ValueError, match=message):
            bank.score(tokens[:2], resp[:2], ["math", "student"], overlap=False, **options)
    custom = TeacherBank(student, forward=lambda t, r, e: [torch.zeros(n) for n in r])
    with pytest.raises(ValueError, match="need the bank's own Hugging Face forward"):
        custom.score(tokens[:1], resp[:1], ["student"], topk_tags={"student"}, topk=2)
    custom.close()


def test_streamed_copies_interleave_with_the_previous_models_layers(
    student: nn.Module, bank: TeacherBank, batch: tuple[list[torch.Tensor], list[int]]
) -> None:
    tokens, resp = batch
    log: list[tuple[str, Any]] = []

    class Recording(InlineCopies):
        def copy_after(self, ready: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
            log.append(("copy", len(pairs)))
            super().copy_after(ready, pairs)

    layers = find_layer_list(student)
    handles = [
        layer.register_forward_hook(lambda m, i, o, k=k: log.append(("layer", k)))
        for k, layer in enumerate(layers)
    ]
    streamer = LayerStreamer(student, bank.params, bank.backups, Recording())
    bank._streamer = streamer
    try:
        out = bank.score(tokens[:2], resp[:2], ["student", "math"], max_tokens=1000, overlap=True)
    finally:
        bank._streamer = None
        for h in handles:
            h.remove()
    assert len(out) == 2
    events = [kind for kind, _ in log]
    # student forward: layer 0, (copy of math's layer 0), layer 1, (copy of layer 1), then outer
    first_copy = events.index("copy")
    assert events[first_copy - 1 : first_copy + 2] == ["layer", "copy", "layer"]
    per_transition = len(layers) + 1  # one copy per layer plus the outer group
    assert events.count("copy") == 2 * per_transition  # student -> math -> student


class DeferredCopies:
    """A stream that runs a copy only when compute waits for it (or at synchronize).

    InlineCopies runs each copy the moment it is issued, so a copy issued too early corrupts
    the current model's scores; this one runs them as late as possible, so a missing wait lets
    the next model compute with stale weights. Together they pin the schedule down on CPU.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[object, list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def mark_compute(self) -> None:
        return None

    def copy_after(self, ready: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> object:
        token = object()
        self.pending.append((token, pairs))
        return token

    def wait(self, done: Any) -> None:
        while any(token is done for token, _ in self.pending):  # FIFO, like one CUDA stream
            _, pairs = self.pending.pop(0)
            for dst, src in pairs:
                dst.copy_(src)

    def synchronize(self) -> None:
        while self.pending:
            self.wait(self.pending[-1][0])


class ForgetfulStreamer(LayerStreamer):
    """A broken schedule: compute never waits for a layer's copy."""

    def _before_layer(self, i: int) -> Any:
        return lambda module, inputs: None


@pytest.mark.parametrize(
    ("streamer_cls", "faithful"), [(LayerStreamer, True), (ForgetfulStreamer, False)]
)
def test_compute_waits_for_every_deferred_copy(
    student: nn.Module,
    bank: TeacherBank,
    batch: tuple[list[torch.Tensor], list[int]],
    alone: list[torch.Tensor],
    streamer_cls: type[LayerStreamer],
    faithful: bool,
) -> None:
    tokens, resp = batch
    before = _snapshot(student)
    bank._streamer = streamer_cls(student, bank.params, bank.backups, DeferredCopies())
    try:
        scores = bank.score(tokens, resp, TAGS, max_tokens=20, overlap=True)
    finally:
        bank._streamer = None
    matches = [torch.allclose(s, a, atol=1e-5) for s, a in zip(scores, alone, strict=True)]
    assert all(matches) == faithful, matches
    assert all(torch.equal(before[n], p) for n, p in student.named_parameters())


def test_a_failing_forward_still_restores_the_student(
    student: nn.Module, batch: tuple[list[torch.Tensor], list[int]]
) -> None:
    tokens, resp = batch
    calls = {"n": 0}

    def forward(toks: Any, lengths: Any, embeddings: Any) -> list[torch.Tensor]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("scoring failed")
        return causal_lm_response_log_probs(student, toks, lengths, input_embeddings=embeddings)

    failing = TeacherBank(student, forward=forward)
    failing.add_teacher("math", tiny_dir(1))
    before = _snapshot(student)
    for overlap in (False, True):
        calls["n"] = 0
        with pytest.raises(RuntimeError, match="scoring failed"):
            failing.score(
                tokens[:3], resp[:3], ["math", "math", "student"], max_tokens=1, overlap=overlap
            )
        after = _snapshot(student)
        assert all(torch.equal(before[n], after[n]) for n in before), overlap
    failing.close()


def test_the_student_backup_follows_training_updates(
    student: nn.Module, batch: tuple[list[torch.Tensor], list[int]]
) -> None:
    tokens, resp = batch
    fresh = TeacherBank(student)
    fresh.add_teacher("math", tiny_dir(1))
    with torch.no_grad():
        student.model.norm.weight.add_(0.5)  # an "optimizer step" after the backup
    try:
        fresh.mark_student_changed()
        changed = _snapshot(student)
        fresh.score(tokens[:2], resp[:2], ["math", "math"])
        assert all(torch.equal(changed[n], p) for n, p in student.named_parameters())
    finally:
        with torch.no_grad():
            student.model.norm.weight.sub_(0.5)
        fresh.close()


def test_micro_batches_respect_the_padded_budget_and_cover_every_sample() -> None:
    lengths = [5, 30, 7, 7, 12, 3, 40]
    plan = plan_micro_batches(lengths, max_tokens=24)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        longest = max(lengths[i] for i in mb)
        assert len(mb) == 1 or len(mb) * longest <= 24
        assert lengths[mb[0]] == longest  # longest first: padding is bounded by the first
    assert [6] in plan and [1] in plan  # longer than the budget: alone


def test_unknown_tags_fail_naming_the_sample(
    bank: TeacherBank, batch: tuple[list[torch.Tensor], list[int]]
) -> None:
    tokens, resp = batch
    with pytest.raises(KeyError, match="sample 1: unknown teacher 'physics'"):
        bank.score(tokens[:2], resp[:2], ["math", "physics"])


def _student_state(student: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().contiguous() for n, p in student.named_parameters()}


def test_bad_checkpoints_fail_naming_the_teacher(student: nn.Module, tmp_path: Path) -> None:
    bank = TeacherBank(student)
    with pytest.raises(FileNotFoundError, match="teacher 'ghost': checkpoint .* does not exist"):
        bank.add_teacher("ghost", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="teacher 'hollow': no \\*.safetensors"):
        bank.add_teacher("hollow", tmp_path / "empty")

    state = _student_state(student)
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:1000].clone()
    save_file(state, str(tmp_path / "small_vocab.safetensors"))
    with pytest.raises(ValueError, match="teacher 'tiny-vocab'.*vocabulary differs"):
        bank.add_teacher("tiny-vocab", tmp_path / "small_vocab.safetensors")

    state = _student_state(student)
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="teacher 'partial'.*missing.*up_proj"):
        bank.add_teacher("partial", tmp_path / "missing.safetensors")

    state = _student_state(student)
    state["lm_head.weight"] = torch.zeros_like(state["model.embed_tokens.weight"])
    save_file(state, str(tmp_path / "untied.safetensors"))
    with pytest.raises(ValueError, match="teacher 'untied'.*lm_head.weight differs"):
        bank.add_teacher("untied", tmp_path / "untied.safetensors")
    assert bank.tags == ["student"]  # a refused checkpoint leaves nothing behind
    bank.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_streamed_scoring_on_cuda_matches_sequential(
    batch: tuple[list[torch.Tensor], list[int]],
) -> None:
    model = load_tiny(0).cuda()
    bank = TeacherBank(model)
    bank.add_teacher("math", tiny_dir(1))
    bank.add_teacher("code", tiny_dir(2))
    tokens, resp = batch
    before = _snapshot(model)
    seq = bank.score(tokens, resp, TAGS, max_tokens=20, overlap=False)
    streamed = bank.score(tokens, resp, TAGS, max_tokens=20, overlap=True)
    for a, b in zip(seq, streamed, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    bank.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_streamed_scoring_on_cuda_of_samples_sharing_a_prefix_matches_sequential(
    prefixed: tuple[list[torch.Tensor], list[int]],
) -> None:
    model = load_tiny(0).cuda()
    bank = TeacherBank(model)
    bank.add_teacher("math", tiny_dir(1))
    bank.add_teacher("code", tiny_dir(2))
    tokens, resp = prefixed
    seq = bank.score(tokens, resp, PREFIX_TAGS, max_tokens=200, overlap=False)
    streamed = bank.score(tokens, resp, PREFIX_TAGS, max_tokens=200, overlap=True)
    for i, (a, b) in enumerate(zip(seq, streamed, strict=True)):
        assert torch.allclose(a, b, atol=1e-5), (i, PREFIX_TAGS[i])
    bank.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_streamed_copies_wait_for_work_already_queued_on_the_compute_stream(
    batch: tuple[list[torch.Tensor], list[int]],
) -> None:
    model = load_tiny(0).cuda()
    bank = TeacherBank(model)
    bank.add_teacher("math", tiny_dir(1))
    tokens, resp = batch
    tags = ["math"] * len(tokens)
    expected = bank.score(tokens, resp, tags, max_tokens=20, overlap=False)
    torch.cuda.synchronize()
    # a restore still queued behind a busy compute stream when scoring starts: the teacher's
    # side-stream copies must land after it, or the student's weights overwrite the teacher's
    torch.cuda._sleep(200_000_000)
    bank.restore(bank.student_tag)
    streamed = bank.score(tokens, resp, tags, max_tokens=20, overlap=True)
    for a, b in zip(expected, streamed, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    bank.close()
