"""The dense MOPD objective: exact reverse KL over the vocabulary, its gradient, its flag."""

from __future__ import annotations

import argparse
from argparse import Namespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from dressage.training.log_probs import response_log_probs
from dressage.training.mopd_loss import compute_mopd_advantages, mopd_policy_loss
from dressage.training.reducer import get_sum_of_sample_mean

pytestmark = pytest.mark.unit

V = 7
TEMPERATURE = 2.0
LOGIT_ROWS = [[1, 2, 3], [6, 7]]  # rows of the packed logits that predict each response token


def _case(teacher_like_student: bool = False) -> tuple[dict[str, Any], torch.Tensor]:
    """Two samples (totals 5 and 4, responses 3 and 2, a masked token), packed logits [1, 9, V],
    the teacher's full log-softmax at the response positions, old log-probs and advantages."""
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, V, (5,), generator=gen), torch.randint(0, V, (4,), generator=gen)]
    logits = (3 * torch.randn(1, 9, V, generator=gen)).requires_grad_()
    if teacher_like_student:
        teacher = [
            torch.log_softmax(logits.detach()[0, rows] / TEMPERATURE, -1) for rows in LOGIT_ROWS
        ]
    else:
        teacher = [torch.log_softmax(3 * torch.randn(r, V, generator=gen), -1) for r in (3, 2)]
    batch: dict[str, Any] = {
        "unconcat_tokens": tokens,
        "total_lengths": [5, 4],
        "response_lengths": [3, 2],
        "loss_masks": [torch.tensor([1, 0, 1]), torch.tensor([1, 1])],
        "rollout_mask_sums": None,
    }
    old, _ = response_log_probs(_args(), batch, logits.detach())
    responses = [t[-r:] for t, r in zip(tokens, (3, 2), strict=True)]
    sampled = [
        f.gather(-1, y[:, None]).squeeze(-1) for f, y in zip(teacher, responses, strict=True)
    ]
    rollout_data: dict[str, Any] = {"log_probs": old, "teacher_log_probs": sampled}
    compute_mopd_advantages(_args(), rollout_data)
    batch |= {
        "log_probs": old,
        "teacher_log_probs": sampled,
        "teacher_full_log_probs": teacher,
        "advantages": rollout_data["advantages"],
    }
    return batch, logits


def _args(**overrides: Any) -> Namespace:
    return Namespace(**{"rollout_temperature": TEMPERATURE, "mopd_objective": "dense", **overrides})


def _dense_loss(
    batch: dict[str, Any], logits: torch.Tensor, **overrides: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    reducer = get_sum_of_sample_mean(
        batch["total_lengths"], batch["response_lengths"], batch["loss_masks"]
    )
    return mopd_policy_loss(_args(**overrides), batch, logits, reducer)


def _naive(batch: dict[str, Any], logits: torch.Tensor) -> torch.Tensor:
    """The objective written out: per sample the masked token mean of
    sum_v pS (log pS - log pT), then the mean over the two samples (one rollout each)."""
    per_sample = []
    for rows, teacher, mask in zip(
        LOGIT_ROWS, batch["teacher_full_log_probs"], batch["loss_masks"], strict=True
    ):
        log_s = torch.log_softmax(logits[0, rows] / TEMPERATURE, -1)
        kl = (log_s.exp() * (log_s - teacher)).sum(-1)
        per_sample.append((kl * mask).sum() / mask.sum())
    return torch.stack(per_sample).sum()  # the hook's reducer sums sample means


def test_dense_loss_is_the_masked_reverse_kl_and_its_gradient_is_autograds() -> None:
    batch, logits = _case()
    loss, metrics = _dense_loss(batch, logits)
    (grad,) = torch.autograd.grad(loss, logits)
    expected = _naive(batch, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    assert expected.item() > 0.5  # a real gap, so a wrong formula cannot pass by accident
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
    assert grad[0, 2].abs().max() == 0.0  # the masked token's row gets nothing
    assert metrics["mopd_loss"].item() == metrics["mopd_dense_reverse_kl"].item() == loss.item()
    # the sampled-token metrics stay (no update yet: current == old)
    assert metrics["mopd_update_kl"].item() == pytest.approx(0.0, abs=1e-6)
    for key in ("mopd_reverse_kl", "mopd_advantage_mean", "mopd_advantage_clipfrac"):
        assert key in metrics


def test_dense_loss_and_gradient_vanish_when_the_student_is_the_teacher() -> None:
    batch, logits = _case(teacher_like_student=True)
    loss, metrics = _dense_loss(batch, logits)
    (grad,) = torch.autograd.grad(loss, logits)
    assert metrics["mopd_dense_reverse_kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert grad.abs().max().item() < 1e-6


def test_with_dense_the_advantages_do_not_enter_the_loss() -> None:
    batch, logits = _case()
    loss, _ = _dense_loss(batch, logits)
    batch["advantages"] = [a + 3.0 for a in batch["advantages"]]
    assert _dense_loss(batch, logits)[0].item() == loss.item()


def test_the_sampled_objective_stays_the_default() -> None:
    batch, logits = _case()
    reducer = get_sum_of_sample_mean(
        batch["total_lengths"], batch["response_lengths"], batch["loss_masks"]
    )
    args = Namespace(rollout_temperature=TEMPERATURE)
    loss, metrics = mopd_policy_loss(args, batch, logits, reducer)
    current = torch.cat(response_log_probs(args, batch, logits.detach())[0])
    assert loss.item() == pytest.approx(reducer(-torch.cat(batch["advantages"]) * current).item())
    assert "mopd_dense_reverse_kl" not in metrics


def test_dense_without_the_teacher_distributions_names_the_key() -> None:
    batch, logits = _case()
    del batch["teacher_full_log_probs"]
    with pytest.raises(KeyError, match="teacher_full_log_probs"):
        _dense_loss(batch, logits)


def test_teacher_distributions_of_another_vocabulary_are_refused() -> None:
    batch, logits = _case()
    batch["teacher_full_log_probs"] = [t[:, :-1] for t in batch["teacher_full_log_probs"]]
    with pytest.raises(ValueError, match=r"teacher_full_log_probs .*\[5, 6\].*\[5, 7\]"):
        _dense_loss(batch, logits)


def test_an_unknown_objective_is_refused_naming_the_flag() -> None:
    batch, logits = _case()
    with pytest.raises(
        ValueError, match="--mopd-objective must be one of sampled, dense, topk; got 'full'"
    ):
        _dense_loss(batch, logits, mopd_objective="full")


def test_the_slime_flag_takes_the_three_objectives(capsys: pytest.CaptureFixture[str]) -> None:
    from dressage.training.mopd_train import add_mopd_arguments

    parser = add_mopd_arguments(argparse.ArgumentParser())
    defaults = parser.parse_args([])
    assert (defaults.mopd_objective, defaults.mopd_topk, defaults.mopd_forward_kl_weight) == (
        "topk",
        None,
        0.0,
    )
    for objective in ("sampled", "dense"):
        assert parser.parse_args(["--mopd-objective", objective]).mopd_objective == objective
    parsed = parser.parse_args(["--mopd-topk", "8", "--mopd-forward-kl-weight", "0.5"])
    assert (parsed.mopd_topk, parsed.mopd_forward_kl_weight) == (8, 0.5)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mopd-objective", "full"])
    assert "--mopd-objective" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--mopd-forward-kl-weight", "1.5"])
    assert "--mopd-forward-kl-weight: must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_the_job_option_takes_the_three_objectives() -> None:
    from dressage.config.job import JobOptions

    assert JobOptions.model_validate({}).mopd_objective == "topk"
    for objective in ("sampled", "dense"):
        assert JobOptions.model_validate({"mopd_objective": objective}).mopd_objective == objective
    with pytest.raises(ValidationError, match="mopd_objective"):
        JobOptions.model_validate({"mopd_objective": "full"})


def _naive_mixed(batch: dict[str, Any], logits: torch.Tensor, b: float) -> torch.Tensor:
    per_sample = []
    for rows, teacher, mask in zip(
        LOGIT_ROWS, batch["teacher_full_log_probs"], batch["loss_masks"], strict=True
    ):
        log_s = torch.log_softmax(logits[0, rows] / TEMPERATURE, -1)
        reverse = (log_s.exp() * (log_s - teacher)).sum(-1)
        forward = (teacher.exp() * (teacher - log_s)).sum(-1)
        per_sample.append((((1 - b) * reverse + b * forward) * mask).sum() / mask.sum())
    return torch.stack(per_sample).sum()


@pytest.mark.parametrize("b", [0.5, 1.0])
def test_a_forward_kl_share_mixes_in_teacher_to_student_kl_with_autograds_gradient(
    b: float,
) -> None:
    batch, logits = _case()
    loss, _ = _dense_loss(batch, logits, mopd_forward_kl_weight=b)
    (grad,) = torch.autograd.grad(loss, logits)
    expected = _naive_mixed(batch, logits, b)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    assert abs(expected.item() - _naive(batch, logits).item()) > 0.1  # the mix changes the loss
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(grad, expected_grad, atol=1e-6)


def test_only_the_forward_share_unlearns_a_token_the_student_is_sure_of() -> None:
    """The student puts all its mass on token 0, the teacher on token 1 (what the embedded run
    that never learnt ``+`` showed): the reverse KL is large but its gradient vanishes; with a
    forward share the gradient lowers token 0 and raises token 1."""
    from dressage.training.mopd_dense import reverse_kl

    logits = torch.full((1, V), -30.0)
    logits[0, 0] = 30.0
    logits.requires_grad_()
    teacher = torch.log_softmax(torch.tensor([[-30.0, 30.0] + [-30.0] * (V - 2)]), -1)
    rows = torch.tensor([0])
    kl = reverse_kl(logits, rows, teacher)
    (grad,) = torch.autograd.grad(kl.sum(), logits)
    assert kl.item() > 50 and grad.abs().max().item() < 1e-6
    mixed = reverse_kl(logits, rows, teacher, forward_weight=0.5)
    (grad,) = torch.autograd.grad(mixed.sum(), logits)
    assert grad[0, 0].item() == pytest.approx(0.5, abs=1e-3)  # descent lowers token 0
    assert grad[0, 1].item() == pytest.approx(-0.5, abs=1e-3)  # and raises token 1
    with pytest.raises(ValueError, match=r"forward_weight must be in \[0, 1\]"):
        reverse_kl(logits, rows, teacher, forward_weight=1.5)


def test_the_forward_share_is_a_job_option_of_dense_and_topk() -> None:
    from dressage.config.job import JobOptions

    assert JobOptions.model_validate({}).mopd_forward_kl_weight == 0.0
    for objective in ("dense", "topk"):
        options = {"mopd_objective": objective, "mopd_forward_kl_weight": 0.5}
        assert JobOptions.model_validate(options).mopd_forward_kl_weight == 0.5
    with pytest.raises(ValidationError, match="needs mopd_objective 'dense' or 'topk'"):
        JobOptions.model_validate({"mopd_objective": "sampled", "mopd_forward_kl_weight": 0.5})
    with pytest.raises(ValidationError, match="mopd_forward_kl_weight"):
        JobOptions.model_validate({"mopd_objective": "dense", "mopd_forward_kl_weight": 2})
