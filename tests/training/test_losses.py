"""Policy-loss math, log-prob extraction from packed logits, and the slime-convention hooks."""

from __future__ import annotations

import math
from argparse import Namespace

import pytest
import torch

from dressage.training.log_probs import (
    response_log_probs,
    response_positions,
    token_entropy,
    token_log_probs,
)
from dressage.training.losses import (
    approx_kl,
    cispo_losses,
    gspo_log_ratio,
    policy_loss,
    ppo_clip_losses,
    sft_loss,
)
from dressage.training.reducer import get_sum_of_sample_mean

pytestmark = pytest.mark.unit

RATIOS = [1.5, 0.5, 1.5, 0.5, 4.0]
ADVANTAGES = [1.0, 1.0, -1.0, -1.0, -2.0]


def _log_ratio() -> torch.Tensor:
    return torch.tensor([math.log(r) for r in RATIOS], requires_grad=True)


def test_ppo_clip_values_clipfrac_and_gradient() -> None:
    log_ratio = _log_ratio()
    losses, clipped = ppo_clip_losses(
        log_ratio, torch.tensor(ADVANTAGES), eps_clip=0.2, eps_clip_high=0.3
    )
    # max(-r A, -clip(r, 0.8, 1.3) A) token by token
    assert losses.tolist() == pytest.approx([-1.3, -0.5, 1.5, 0.8, 8.0])
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    losses.sum().backward()
    # clipped tokens carry no gradient; the others d(-r A)/d log r = -r A
    assert log_ratio.grad is not None
    assert log_ratio.grad.tolist() == pytest.approx([0.0, -0.5, 1.5, 0.0, 8.0])


def test_dual_clip_caps_negative_advantage_tokens_only() -> None:
    losses, _ = ppo_clip_losses(
        _log_ratio(), torch.tensor(ADVANTAGES), eps_clip=0.2, eps_clip_high=0.3, eps_clip_c=3.0
    )
    # token 5: min(8, -3 * -2) = 6; positive-advantage tokens unchanged
    assert losses.tolist() == pytest.approx([-1.3, -0.5, 1.5, 0.8, 6.0])
    with pytest.raises(ValueError, match="eps_clip_c must be > 1"):
        ppo_clip_losses(_log_ratio(), torch.tensor(ADVANTAGES), eps_clip=0.2, eps_clip_c=1.0)


def test_symmetric_clip_when_no_upper_bound_is_given() -> None:
    losses, clipped = ppo_clip_losses(
        torch.tensor([math.log(1.25)]), torch.tensor([1.0]), eps_clip=0.2
    )
    assert losses.item() == pytest.approx(-1.2) and clipped.item() == 1.0


def test_gspo_ratio_is_the_masked_sequence_mean_broadcast() -> None:
    new = [torch.tensor([0.0, -1.0, -5.0]), torch.tensor([-2.0])]
    old = [torch.tensor([-0.5, -0.5, 0.0]), torch.tensor([-1.0])]
    masks = [torch.tensor([1, 1, 0]), torch.tensor([1])]
    ratio = gspo_log_ratio(new, old, masks)
    assert ratio.tolist() == pytest.approx([0.0, 0.0, 0.0, -1.0])


def test_cispo_truncates_the_weight_from_above_and_stops_its_gradient() -> None:
    log_probs = torch.tensor([-1.0, -1.0], requires_grad=True)
    old = torch.tensor([-1.0 - math.log(2.0), -1.0])  # ratios 2 and 1
    losses, clipped = cispo_losses(log_probs, old, torch.tensor([1.0, -1.0]), eps_clip_high=0.2)
    assert clipped.tolist() == [1.0, 0.0]
    assert losses.tolist() == pytest.approx([1.2 * 1.0, -1.0])
    losses.sum().backward()
    assert log_probs.grad is not None
    assert log_probs.grad.tolist() == pytest.approx([-1.2, 1.0])


def test_kl_estimators() -> None:
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    x = lp - ref
    assert approx_kl(lp, ref, "k1").tolist() == pytest.approx(x.tolist())
    assert approx_kl(lp, ref, "k2").tolist() == pytest.approx((0.5 * x**2).tolist())
    k3 = torch.exp(-x) - 1 + x
    assert approx_kl(lp, ref, "k3").tolist() == pytest.approx(k3.tolist())
    assert approx_kl(lp, ref, "low_var_kl").tolist() == pytest.approx(k3.tolist())
    with pytest.raises(ValueError, match="unknown kl_loss_type 'k9'"):
        approx_kl(lp, ref, "k9")


@pytest.mark.parametrize(("temperature", "chunk"), [(1.0, 0), (0.7, 3)])
def test_chunked_log_probs_and_entropy_match_log_softmax(temperature: float, chunk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(10, 50, generator=gen)).requires_grad_()
    rows = torch.tensor([9, 1, 4, 5, 6, 0, 2])
    targets = torch.randint(0, 50, (7,), generator=gen)
    upstream = torch.randn(7, generator=gen)

    ours = token_log_probs(logits, rows, targets, temperature=temperature, chunk_tokens=chunk)
    (ours_grad,) = torch.autograd.grad((ours * upstream).sum(), logits)
    full = torch.log_softmax(logits[rows] / temperature, -1)
    ref = full.gather(-1, targets[:, None]).squeeze(-1)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(ours_grad, ref_grad, atol=1e-5)

    ent = token_entropy(logits, rows, temperature=temperature, chunk_tokens=chunk)
    (ent_grad,) = torch.autograd.grad((ent * upstream).sum(), logits)
    full = torch.log_softmax(logits[rows] / temperature, -1)
    ref_ent = -(full.exp() * full).sum(-1)
    (ref_ent_grad,) = torch.autograd.grad((ref_ent * upstream).sum(), logits)
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    assert torch.allclose(ent_grad, ref_ent_grad, atol=1e-5)


def test_response_positions_follow_the_packed_layout() -> None:
    logit_rows, token_rows = response_positions([4, 3], [2, 1])
    assert token_rows.tolist() == [2, 3, 6]
    assert logit_rows.tolist() == [1, 2, 5]
    with pytest.raises(ValueError, match="sample 1: response_length 3"):
        response_positions([4, 3], [2, 3])


def _packed_batch(seed: int = 0) -> tuple[dict[str, object], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, 40, (5,), generator=gen), torch.randint(0, 40, (4,), generator=gen)]
    batch: dict[str, object] = {
        "unconcat_tokens": tokens,
        "tokens": torch.cat(tokens).unsqueeze(0),
        "total_lengths": [5, 4],
        "response_lengths": [3, 2],
        "loss_masks": [torch.tensor([1, 0, 1]), torch.tensor([1, 1])],
        "rollout_mask_sums": torch.tensor([2.0, 2.0]),
    }
    logits = torch.randn(1, 10, 40, generator=gen)  # one trailing pad row, ignored
    return batch, logits


def test_response_log_probs_reads_the_row_before_each_response_token() -> None:
    batch, logits = _packed_batch()
    log_probs, entropy = response_log_probs(Namespace(), batch, logits, with_entropy=True)
    full = torch.log_softmax(logits[0], -1)
    packed = batch["tokens"][0]  # type: ignore[index]
    expected = [
        [full[r, packed[r + 1]] for r in (1, 2, 3)],
        [full[r, packed[r + 1]] for r in (6, 7)],
    ]
    assert [t.tolist() for t in log_probs] == [
        pytest.approx([float(v) for v in row]) for row in expected
    ]
    assert entropy is not None and [t.numel() for t in entropy] == [3, 2]
    # the packed form of the tokens gives the same answer
    del batch["unconcat_tokens"]
    again, _ = response_log_probs(Namespace(), batch, logits)
    assert all(torch.equal(a, b) for a, b in zip(again, log_probs, strict=True))


def _policy_args(**kw: object) -> Namespace:
    base = {"advantage_estimator": "grpo", "eps_clip": 0.2, "eps_clip_high": None}
    base.update(kw)
    return Namespace(**base)


def test_policy_loss_at_ratio_one_is_minus_the_reduced_advantage() -> None:
    batch, logits = _packed_batch()
    logits.requires_grad_()
    old, _ = response_log_probs(Namespace(), batch, logits.detach())
    batch["log_probs"] = old
    batch["advantages"] = [torch.tensor([1.0, 9.0, -1.0]), torch.tensor([0.5, 0.5])]
    batch["rollout_log_probs"] = [o - 0.1 for o in old]
    reducer = get_sum_of_sample_mean([5, 4], [3, 2], batch["loss_masks"], torch.tensor([2.0, 2.0]))  # type: ignore[arg-type]
    loss, metrics = policy_loss(_policy_args(), batch, logits, reducer)
    # masked token 2 of sample 0 is ignored: (-1 + 1) / 2 + (-0.5 - 0.5) / 2
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["pg_clipfrac"].item() == 0.0
    assert metrics["ppo_kl"].item() == pytest.approx(0.0, abs=1e-6)
    # |log pi - rollout log pi| = 0.1 on every token, reduced like the loss: 0.1 * (1 + 1)
    assert metrics["train_rollout_logprob_abs_diff"].item() == pytest.approx(0.2, abs=1e-5)
    assert set(metrics) >= {"pg_loss", "pg_clipfrac", "ppo_kl", "entropy_loss", "loss"}
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_policy_loss_adds_the_kl_term_and_the_entropy_bonus() -> None:
    batch, logits = _packed_batch(seed=1)
    old, ent = response_log_probs(Namespace(), batch, logits, with_entropy=True)
    batch.update(log_probs=old, advantages=[torch.zeros(3), torch.zeros(2)])
    batch["ref_log_probs"] = [o + 0.3 for o in old]
    masks = batch["loss_masks"]
    reducer = get_sum_of_sample_mean([5, 4], [3, 2], masks, torch.tensor([2.0, 2.0]))  # type: ignore[arg-type]
    args = _policy_args(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1", entropy_coef=0.01)
    loss, metrics = policy_loss(args, batch, logits, reducer)
    assert ent is not None
    entropy = reducer(torch.cat(ent))
    assert metrics["kl_loss"].item() == pytest.approx(-0.3 * 2, abs=1e-5)
    assert loss.item() == pytest.approx(0.5 * -0.6 - 0.01 * entropy.item(), abs=1e-5)


def test_sft_loss_is_the_reduced_negative_log_likelihood() -> None:
    batch, logits = _packed_batch()
    log_probs, _ = response_log_probs(Namespace(), batch, logits)
    reducer = get_sum_of_sample_mean([5, 4], [3, 2], batch["loss_masks"])  # type: ignore[arg-type]
    loss, _ = sft_loss(Namespace(), batch, logits, reducer)
    assert loss.item() == pytest.approx(-reducer(torch.cat(log_probs)).item())


def test_a_replacement_log_prob_function_is_used_by_the_hooks() -> None:
    batch, logits = _packed_batch()
    args = Namespace(log_prob_function_path="tests.training.test_losses.constant_log_probs")
    reducer = get_sum_of_sample_mean([5, 4], [3, 2], batch["loss_masks"])  # type: ignore[arg-type]
    loss, _ = sft_loss(args, batch, logits, reducer)
    assert loss.item() == pytest.approx(2 * 0.25)


def constant_log_probs(
    args: Namespace, batch: dict[str, object], logits: torch.Tensor, with_entropy: bool = False
) -> tuple[list[torch.Tensor], None]:
    """Stands in for a vocab-parallel helper: every response token gets log-prob -0.25."""
    return [torch.full((int(r),), -0.25) for r in batch["response_lengths"]], None  # type: ignore[attr-defined]
