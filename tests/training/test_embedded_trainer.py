"""The embedded trainer on tiny Qwen3 models: real gradients, real optimizer steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dressage.training.embedded import EmbeddedTrainer, trainer_args
from dressage.training.log_probs import causal_lm_response_log_probs
from dressage.training.mopd_topk import support_of
from tests.training.train_data_factory import (
    MOPD_HOOKS,
    load_tiny,
    sample_responses,
    tiny_dir,
    train_data,
)

pytestmark = pytest.mark.unit


def _trainer(teachers: dict[str, Any] | None = None, **options: Any) -> EmbeddedTrainer:
    args = trainer_args(hf_checkpoint=str(tiny_dir(0)), device="cpu", weight_decay=0.0, **options)
    return EmbeddedTrainer(args, teachers=teachers)


@pytest.fixture(scope="module")
def sharp_teachers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two teachers far from the student: other seeds with 3x sharper output distributions."""
    out = {}
    for tid, seed in (("math", 1), ("code", 2)):
        model = load_tiny(seed)
        with torch.no_grad():
            model.model.norm.weight.mul_(3.0)
        folder = tmp_path_factory.mktemp(f"teacher-{tid}")
        model.save_pretrained(str(folder))
        out[tid] = folder
    return out


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_missing_teacher_checkpoint_fails_before_the_student_loads(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="teacher 'ghost': checkpoint .*nowhere"):
        _trainer({"ghost": tmp_path / "nowhere"}, global_batch_size=1)


def test_bad_teacher_id_fails_before_any_training_step() -> None:
    trainer = _trainer({"math": tiny_dir(1)}, global_batch_size=2, **MOPD_HOOKS)
    before = _params(trainer.model)
    data = train_data([(4, 3), (4, 3)], teacher_ids=["math", "history"])
    with pytest.raises(ValueError, match="sample 1 .*teacher_id 'history' is not a loaded"):
        trainer.train(0, data)
    assert trainer.num_steps == 0
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def _manual_sft_grad(
    model: nn.Module, data: dict[str, Any], per_token: bool
) -> dict[str, torch.Tensor]:
    """(1/G) sum over rollouts of each rollout's token-mean NLL, by plain autograd."""
    model.zero_grad(set_to_none=True)
    by_rollout: dict[int, list[int]] = {}
    for i, rid in enumerate(data["rollout_ids"]):
        by_rollout.setdefault(rid, []).append(i)
    total = torch.zeros(())
    all_tokens = sum(sum(m) for m in data["loss_masks"])
    for positions in by_rollout.values():
        tokens_in_rollout = sum(sum(data["loss_masks"][i]) for i in positions)
        for i in positions:
            ids = torch.tensor(data["tokens"][i])
            r = data["response_lengths"][i]
            logp = torch.log_softmax(model(ids[None]).logits[0, -r - 1 : -1].float(), -1)
            picked = logp.gather(-1, ids[-r:, None]).squeeze(-1)
            nll = -(picked * torch.tensor(data["loss_masks"][i])).sum()
            total = total + nll / (all_tokens if per_token else tokens_in_rollout)
    (total / (1 if per_token else len(by_rollout))).backward()
    return _grads(model)


def test_step_gradient_is_the_rollout_mean_of_token_means_however_micro_batched() -> None:
    # rollout 4: two siblings (one with a masked tool token); rollout 1: one sample
    data = train_data(
        [(3, 3), (4, 2), (3, 2)], rollout_ids=[4, 4, 1], masks=[[1, 0, 1], [1, 1], [0, 1]]
    )
    trainer = _trainer(global_batch_size=2, loss_type="sft_loss", lr=0.0, clip_grad=0.0)
    # siblings split across micro-batches, then together; per-token mode divides by all tokens
    for per_token, micro_batch_size in ((False, 1), (False, 3), (True, 1)):
        trainer.args.calculate_per_token_loss = per_token
        trainer.args.micro_batch_size = micro_batch_size
        expected = _manual_sft_grad(trainer.model, data, per_token)
        trainer.train(0, data)
        got = _grads(trainer.model)
        for name, grad in expected.items():
            error = float((got[name] - grad).norm() / grad.norm())
            assert error < 1e-4, (per_token, micro_batch_size, name, error)


def test_a_grpo_step_raises_positively_advantaged_tokens() -> None:
    rewards = [1.0, -1.0, 1.0, -1.0]
    data = train_data([(4, 5)] * 4, rewards=rewards, seed=5)
    trainer = _trainer(
        global_batch_size=4, micro_batch_size=2, lr=1e-3, use_kl_loss=True, kl_loss_coef=0.01
    )
    tokens = [torch.tensor(t) for t in data["tokens"]]

    def sequence_log_probs() -> list[float]:
        with torch.no_grad():
            out = causal_lm_response_log_probs(trainer.model, tokens, [5] * 4)
        return [float(x.sum()) for x in out]

    before = sequence_log_probs()
    metrics = trainer.train(0, data)
    after = sequence_log_probs()
    for b, a, r in zip(before, after, rewards, strict=True):
        assert (a - b) * r > 0, (b, a, r)
    assert metrics["train/pg_clipfrac"] == 0.0  # first step: ratio 1
    assert metrics["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference
    assert metrics["train/num_steps"] == 1.0


def test_mopd_steps_toward_fixed_teachers_shrink_the_sampled_token_reverse_kl(
    sharp_teachers: dict[str, Path],
) -> None:
    from transformers import AutoModelForCausalLM

    trainer = _trainer(
        dict(sharp_teachers), global_batch_size=4, micro_batch_size=4, lr=1e-3, **MOPD_HOOKS
    )
    prompts = torch.randint(0, 5000, (4, 4), generator=torch.Generator().manual_seed(1))
    ids = sample_responses(trainer.model, prompts, 6, seed=2)  # on-policy for the first step
    teacher_ids = ["math", "math", "code", "code"]
    data = train_data([(4, 6)] * 4, tokens=ids.tolist(), teacher_ids=teacher_ids)
    tokens = list(ids)
    teacher_lp: list[torch.Tensor] = []
    for tid in ("math", "code"):
        teacher = AutoModelForCausalLM.from_pretrained(str(sharp_teachers[tid]))
        mine = [i for i, t in enumerate(teacher_ids) if t == tid]
        with torch.no_grad():
            teacher_lp += causal_lm_response_log_probs(teacher, [tokens[i] for i in mine], [6, 6])

    def gap() -> torch.Tensor:
        with torch.no_grad():
            student = causal_lm_response_log_probs(trainer.model, tokens, [6] * 4)
        return torch.cat([s - t for s, t in zip(student, teacher_lp, strict=True)])

    start = gap()
    history = [trainer.train(k, data) for k in range(3)]
    end = gap()
    # The sampled-token reverse KL estimate mean(log pi_s - log pi_t) and its spread shrink.
    assert start.mean() > 0.05
    assert end.mean().abs() < 0.35 * start.mean()
    assert end.square().mean() < 0.25 * start.square().mean()
    # the trainer's own metric is the same estimate, measured before each step
    assert history[0]["train/mopd_reverse_kl"] == pytest.approx(float(start.mean()), abs=1e-4)
    for tid in ("math", "code"):
        assert f"rollout/mopd/opd_reverse_kl_train_aggregation_mean/{tid}" in history[0]


def _task_vocab_model(seed: int) -> Path:
    from dressage.tiny import TinyModelSpec, tiny_model_dir

    return tiny_model_dir(TinyModelSpec(vocab="qwen3.5-tasks", seed=seed))


@pytest.fixture(scope="module")
def sharp_task_vocab_teachers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two 704-row-vocabulary teachers far from the student: other seeds, 4x sharper outputs."""
    from transformers import AutoModelForCausalLM

    out = {}
    for tid, seed in (("math", 1), ("code", 2)):
        model = AutoModelForCausalLM.from_pretrained(str(_task_vocab_model(seed)))
        with torch.no_grad():
            model.model.norm.weight.mul_(4.0)
        folder = tmp_path_factory.mktemp(f"task-vocab-teacher-{tid}")
        model.save_pretrained(str(folder))
        out[tid] = folder
    return out


def _dense_kl(student: nn.Module, teachers: list[nn.Module], ids: torch.Tensor, r: int) -> float:
    """Mean over samples of the token-mean sum_v pS (log pS - log pT), written out."""
    per_sample = []
    with torch.no_grad():
        for row, teacher in zip(ids, teachers, strict=True):
            log_s = torch.log_softmax(student(row[None]).logits[0, -r - 1 : -1].float(), -1)
            log_t = torch.log_softmax(teacher(row[None]).logits[0, -r - 1 : -1].float(), -1)
            per_sample.append(float((log_s.exp() * (log_s - log_t)).sum(-1).mean()))
    return sum(per_sample) / len(per_sample)


def test_dense_mopd_steps_shrink_the_full_reverse_kl_to_each_samples_teacher(
    sharp_task_vocab_teachers: dict[str, Path],
) -> None:
    from transformers import AutoModelForCausalLM

    paths = sharp_task_vocab_teachers
    args = trainer_args(
        hf_checkpoint=str(_task_vocab_model(0)),
        device="cpu",
        weight_decay=0.0,
        global_batch_size=4,
        micro_batch_size=2,
        lr=3e-3,
        mopd_objective="dense",
        **MOPD_HOOKS,
    )
    trainer = EmbeddedTrainer(args, teachers=paths)
    prompts = torch.randint(0, 600, (4, 4), generator=torch.Generator().manual_seed(1))
    ids = sample_responses(trainer.model, prompts, 6, seed=2)  # the student's own samples
    teacher_ids = ["math", "code", "math", "code"]
    data = train_data([(4, 6)] * 4, tokens=ids.tolist(), teacher_ids=teacher_ids)
    loaded = {t: AutoModelForCausalLM.from_pretrained(str(p)).eval() for t, p in paths.items()}
    teachers = [loaded[t] for t in teacher_ids]

    start = _dense_kl(trainer.model, teachers, ids, 6)
    history = [trainer.train(k, data) for k in range(20)]
    end = _dense_kl(trainer.model, teachers, ids, 6)
    # 0.25 -> 0.03 here; a sign-flipped gradient ends near 2.0, a missing one stays at 0.25
    assert start > 0.15
    assert end < 0.3 * start, (start, end)
    # the trainer's loss is that KL, measured before each step; sampled-token metrics stay
    assert history[0]["train/mopd_dense_reverse_kl"] == pytest.approx(start, rel=1e-4)
    assert history[0]["train/mopd_loss"] == history[0]["train/mopd_dense_reverse_kl"]
    assert "train/mopd_reverse_kl" in history[0] and "rollout/teacher_log_probs" in history[0]


def _task_vocab_trainer(teachers: dict[str, Path], **options: Any) -> EmbeddedTrainer:
    args = trainer_args(
        hf_checkpoint=str(_task_vocab_model(0)),
        device="cpu",
        weight_decay=0.0,
        global_batch_size=4,
        micro_batch_size=2,
        lr=3e-3,
        **MOPD_HOOKS,
        **options,
    )
    return EmbeddedTrainer(args, teachers=teachers)


def _own_samples(model: nn.Module, teacher_ids: list[str]) -> tuple[torch.Tensor, dict[str, Any]]:
    """Four 4-token prompts continued by 6 tokens sampled from ``model``, and their train_data."""
    prompts = torch.randint(0, 600, (4, 4), generator=torch.Generator().manual_seed(1))
    ids = sample_responses(model, prompts, 6, seed=2)
    return ids, train_data([(4, 6)] * 4, tokens=ids.tolist(), teacher_ids=teacher_ids)


def _record_grads(trainer: EmbeddedTrainer) -> list[dict[str, torch.Tensor]]:
    """The gradients each optimizer step applies, recorded as it starts."""
    grads: list[dict[str, torch.Tensor]] = []
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.append(_grads(trainer.model)))
    return grads


def test_topk_mopd_with_k_the_vocabulary_trains_exactly_as_dense(
    sharp_task_vocab_teachers: dict[str, Path],
) -> None:
    teacher_ids = ["math", "code", "math", "code"]
    options = {"mopd_forward_kl_weight": 0.5}
    dense = _task_vocab_trainer(sharp_task_vocab_teachers, mopd_objective="dense", **options)
    topk = _task_vocab_trainer(
        sharp_task_vocab_teachers, mopd_objective="topk", mopd_topk=704, **options
    )
    dense_grads, topk_grads = _record_grads(dense), _record_grads(topk)
    _, data = _own_samples(dense.model, teacher_ids)
    want, got = dense.train(0, data), topk.train(0, data)
    assert got["train/mopd_topk_kl"] == pytest.approx(want.pop("train/mopd_dense_reverse_kl"))
    for key, value in want.items():
        if not key.startswith("perf/"):
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for name, grad in dense_grads[0].items():
        assert torch.allclose(topk_grads[0][name], grad, rtol=1e-4, atol=1e-8), name
    # AdamW's first step moves a weight by about lr * g / (|g| + eps): gradients of ~eps agree
    # to 1e-9 but move their weights differently by a fraction of lr (a sign error: ~2 lr)
    after = _params(topk.model)
    for name, weight in _params(dense.model).items():
        assert torch.allclose(after[name], weight, rtol=0.0, atol=0.05 * 3e-3), name


def test_topk_mopd_keeps_each_samples_teacher_top_k_and_shrinks_the_bucketed_kl(
    sharp_task_vocab_teachers: dict[str, Path],
) -> None:
    from transformers import AutoModelForCausalLM

    k, r = 4, 6
    trainer = _task_vocab_trainer(sharp_task_vocab_teachers, mopd_objective="topk", mopd_topk=k)
    teacher_ids = ["math", "code", "code", "math"]
    ids, data = _own_samples(trainer.model, teacher_ids)
    loaded = {
        t: AutoModelForCausalLM.from_pretrained(str(p)).eval()
        for t, p in sharp_task_vocab_teachers.items()
    }
    with torch.no_grad():  # each sample's own teacher, written out
        dists = [
            torch.log_softmax(loaded[t](row[None]).logits[0, -r - 1 : -1].float(), -1)
            for row, t in zip(ids, teacher_ids, strict=True)
        ]
    batches: list[dict[str, Any]] = []
    loss_fn = trainer.loss_fn

    def recording(*hook_args: Any) -> Any:
        batches.append(hook_args[1])
        return loss_fn(*hook_args)

    trainer.loss_fn = recording
    before = _params(trainer.model)
    history = [trainer.train(step, data) for step in range(10)]

    seen = []
    for batch in batches[:2]:  # the first step's two micro-batches
        assert batch["teacher_full_log_probs"] is None  # nothing [R, V] kept
        for tokens, carrier in zip(
            batch["unconcat_tokens"], batch["teacher_log_probs"], strict=True
        ):
            (i,) = [j for j, row in enumerate(ids) if torch.equal(row, tokens.cpu())]
            seen.append(i)
            support, dist, sampled = support_of(carrier), dists[i], ids[i][-r:]
            assert support is not None and carrier.shape == (r,)
            assert support.ids.shape == support.log_probs.shape == (r, k)
            assert support.ids.dtype == torch.int32
            top = dist.topk(k, dim=-1)
            assert torch.equal(support.ids.long(), top.indices), i
            assert torch.allclose(support.log_probs, top.values, atol=1e-5), i
            assert torch.allclose(carrier, dist.gather(-1, sampled[:, None])[:, 0], atol=1e-5)
            kept = torch.zeros_like(dist, dtype=torch.bool).scatter_(-1, top.indices, True)
            kept.scatter_(-1, sampled[:, None], True)
            tail = dist.masked_fill(kept, float("-inf")).logsumexp(-1)
            assert torch.allclose(support.tail, tail, atol=1e-4), i
    assert sorted(seen) == [0, 1, 2, 3]
    # it trains: the weights move and the bucketed KL to each sample's teacher falls
    after = _params(trainer.model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    first, last = history[0]["train/mopd_topk_kl"], history[-1]["train/mopd_topk_kl"]
    assert first > 0.03 and last < 0.3 * first, (first, last)
    assert history[0]["train/mopd_loss"] == first


def test_a_mopd_topk_above_the_students_vocabulary_is_refused_at_init() -> None:
    args = trainer_args(
        hf_checkpoint=str(_task_vocab_model(0)),
        device="cpu",
        global_batch_size=1,
        mopd_objective="topk",
        mopd_topk=705,
    )
    with pytest.raises(
        ValueError, match="^--mopd-topk 705 exceeds the student's vocabulary of 704 tokens"
    ):
        EmbeddedTrainer(args)


def test_an_unknown_mopd_objective_fails_before_the_student_loads() -> None:
    with pytest.raises(
        ValueError, match="--mopd-objective must be one of sampled, dense, topk; got 'bogus'"
    ):
        _trainer(global_batch_size=1, mopd_objective="bogus")


def test_saved_weights_load_as_a_hugging_face_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = _trainer(global_batch_size=2, lr=1e-3)
    trainer.train(0, train_data([(3, 2), (3, 2)], rewards=[1.0, -1.0]))
    target = trainer.save_weights(tmp_path / "weights" / "v1")
    assert (target / "tokenizer.json").exists() and (target / "config.json").exists()
    assert not list(target.parent.glob(".v1.tmp-*"))
    loaded = AutoModelForCausalLM.from_pretrained(str(target))
    for name, p in trainer.model.named_parameters():
        assert torch.equal(loaded.get_parameter(name), p.detach()), name
    half = trainer.save_weights(tmp_path / "weights" / "v1", dtype=torch.bfloat16)
    assert AutoModelForCausalLM.from_pretrained(str(half)).dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_mopd_step_on_cuda_streams_teachers_and_trains() -> None:
    args = trainer_args(
        hf_checkpoint=str(tiny_dir(0)), device="cuda", global_batch_size=2, lr=1e-3, **MOPD_HOOKS
    )
    trainer = EmbeddedTrainer(args, teachers={"math": tiny_dir(1), "code": tiny_dir(2)})
    data = train_data([(4, 5), (6, 3)], teacher_ids=["math", "code"])
    metrics = trainer.train(0, data)
    assert trainer.num_steps == 1
    assert all(v == v for v in metrics.values())  # no NaN


def test_the_learning_rate_follows_megatrons_schedule_step_by_step() -> None:
    """Warm-up then cosine to ``min_lr`` over the run's optimizer steps (num_rollout x steps a
    rollout), ``min_lr`` after; each optimizer step uses the schedule's value and reports it."""
    trainer = _trainer(
        global_batch_size=2, rollout_batch_size=4, n_samples_per_prompt=1, num_rollout=5,
        loss_type="sft_loss", lr=1e-3, min_lr=1e-4, lr_warmup_iters=2, lr_decay_style="cosine",
    )  # fmt: skip
    schedule = [trainer.learning_rate(k) for k in range(12)]
    assert schedule[:2] == pytest.approx([5e-4, 1e-3])  # warm-up
    assert schedule[2] == pytest.approx(1e-3) and schedule[6] == pytest.approx(5.5e-4)  # halfway
    assert all(a >= b for a, b in zip(schedule[2:], schedule[3:], strict=False))
    assert schedule[10:] == pytest.approx([1e-4, 1e-4])  # 5 rollouts x 2 steps, then the floor
    data = train_data([(3, 3)] * 4, rollout_ids=[0, 1, 2, 3])
    metrics = trainer.train(0, data)  # two optimizer steps: 5e-4, then 1e-3
    assert metrics["train/lr"] == pytest.approx(7.5e-4)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    trainer.args.lr_decay_style = "linear"
    assert trainer.learning_rate(6) == pytest.approx(1e-3 - 9e-4 * 0.5)
    trainer.args.lr_decay_style = "constant"
    assert trainer.learning_rate(50) == 1e-3


def test_an_unknown_lr_decay_style_and_a_decay_without_a_length_are_refused() -> None:
    with pytest.raises(ValueError, match="lr_decay_style 'wsd': expected one of"):
        _trainer(global_batch_size=2, lr_decay_style="wsd")
    trainer = _trainer(global_batch_size=2, lr_decay_style="linear")
    with pytest.raises(ValueError, match="needs lr_decay_iters or num_rollout"):
        trainer.learning_rate(0)
